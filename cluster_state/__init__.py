"""The replicated GPU/job allocation store (HiveD's model) built on ``consensus``."""
