"""Sans-I/O protocol cores. Nothing here imports asyncio, socket, time or global random."""
