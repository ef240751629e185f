"""Regenerate ``fixtures.json``: HiveD's own answers, from HiveD's own Go code.

    python tests/k8s/hived_conformance/generate.py --hived PATH [--ref REF] [--out FILE]
    python tests/k8s/hived_conformance/generate.py --hived PATH --verify ANSWERS [--out FILE]

``PATH`` is a microsoft/hivedscheduler checkout (a work tree), or its git directory (a bare
or mirror clone: ``REF``, default HEAD, is exported from it). Needs Go (Debian:
``apt-get install golang-go``; HiveD vendors its dependencies and builds in GOPATH mode, so
nothing is downloaded). The checker ``checker/sdpaxos_conformance_test.go`` (sdpaxos's code)
is copied into a temporary copy of the checkout as ``pkg/scheduler/`` test file, built with
``go test -c`` and run; it drives HiveD's scheduler through its own web server with a fake
API server and writes the fixtures (see that file's header). Nothing of HiveD is copied into
this repository: only what HiveD answered.

``--verify ANSWERS`` runs the other way: ANSWERS (written by ``test_hived_conformance.py``
with ``SDPAXOS_HIVED_ANSWERS=FILE``) holds the pods sdpaxos's extender bound and the
annotations its Bindings wrote; HiveD recovers them as it does on a restart (every bound pod
through its informer, ``AddAllocatedPod``) and the output (default ``verified.json``) says,
per pod, whether HiveD took it and, per group, what HiveD rebuilt.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKER = HERE / "checker" / "sdpaxos_conformance_test.go"
IMPORT_PATH = "github.com/microsoft/hivedscheduler"


def export_tree(source: Path, ref: str, into: Path) -> tuple[str, list[str]]:
    """Copy the checkout at ``source`` into ``into``: its commit id and the files that could
    not be read (a partial mirror may lack some large vendored blobs; the checker needs none
    of them, and the build says so if it does)."""
    if (source / "pkg").is_dir():  # a work tree
        shutil.copytree(source, into, ignore=shutil.ignore_patterns(".git"))
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        return commit or "unknown", []
    git = ["git", "--git-dir", str(source)]
    commit = subprocess.run([*git, "rev-parse", ref], capture_output=True, text=True,
                            check=True).stdout.strip()
    listing = subprocess.run([*git, "ls-tree", "-r", "-z", commit], capture_output=True,
                             check=True).stdout.split(b"\0")
    missing = []
    for entry in listing:
        if not entry:
            continue
        meta, _, path = entry.partition(b"\t")
        _, kind, obj = meta.split()
        if kind != b"blob":
            continue
        blob = subprocess.run([*git, "cat-file", "blob", obj.decode()], capture_output=True)
        target = into / path.decode()
        if blob.returncode != 0:
            missing.append(path.decode())
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob.stdout)
    return commit, missing


def dump(doc: dict[str, object]) -> str:
    """The fixtures as JSON with one line per record (a step, a spec case, a schema), so a
    regeneration diffs record by record."""
    def lines(value: object, depth: int) -> str:
        if depth < 3 and isinstance(value, dict):
            inner = ",\n".join(f"{json.dumps(k)}: {lines(v, depth + 1)}"
                               for k, v in sorted(value.items()))
            return "{\n" + inner + "\n}"
        if depth < 4 and isinstance(value, list):  # a scenario's steps: one line each
            return "[\n" + ",\n".join(lines(v, depth + 1) for v in value) + "\n]"
        return json.dumps(value, sort_keys=True, separators=(",", ":"))

    return lines(doc, 0) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hived", required=True, type=Path,
                        help="a microsoft/hivedscheduler work tree or git directory")
    parser.add_argument("--ref", default="HEAD", help="the commit to export from a git dir")
    parser.add_argument("--out", type=Path, default=HERE / "fixtures.json")
    parser.add_argument("--verify", type=Path, default=None, metavar="ANSWERS",
                        help="let HiveD recover the pods in ANSWERS instead")
    parser.add_argument("--keep", action="store_true", help="keep the build directory")
    args = parser.parse_args()
    go = shutil.which("go")
    if go is None:
        print("generate.py: no go toolchain (apt-get install golang-go)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="hived-conformance-"))
    try:
        tree = work / "src" / IMPORT_PATH
        commit, missing = export_tree(args.hived.resolve(), args.ref, tree)
        shutil.copy(CHECKER, tree / "pkg" / "scheduler" / CHECKER.name)
        env = {**os.environ, "GOPATH": str(work), "GO111MODULE": "off", "GOFLAGS": "",
               "GOCACHE": os.environ.get("GOCACHE", str(Path.home() / ".cache" / "go-build"))}
        binary = work / "checker.test"
        subprocess.run([go, "test", "-c", "-o", str(binary), "./pkg/scheduler/"], cwd=tree,
                       env=env, check=True)
        out = work / "fixtures.json"
        log = work / "checker.log"
        test = "TestSdpaxosVerify" if args.verify else "TestSdpaxosConformance"
        run_env = {**env, "SDPAXOS_OUT": str(out), "SDPAXOS_HIVED_ROOT": str(tree)}
        if args.verify:
            run_env["SDPAXOS_VERIFY"] = str(args.verify.resolve())
        with log.open("wb") as sink:
            run = subprocess.run([str(binary), "-test.run", f"^{test}$", "-test.v"], cwd=tree,
                                 env=run_env, stdout=sink, stderr=subprocess.STDOUT)
        if run.returncode != 0 or not out.exists():
            print(log.read_text()[-4000:], file=sys.stderr)
            return 1
        doc = json.loads(out.read_text())
        if args.verify:
            target = args.out if args.out != HERE / "fixtures.json" else Path("verified.json")
            target.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            print(f"wrote {target}")
            return 0
        version = subprocess.run([go, "version"], capture_output=True, text=True).stdout.strip()
        # the example configurations the scenarios ran on: the tests build the store of each
        configs = sorted({sc["config"] for sc in doc["scenarios"]}
                         | {"example/config/basic/hivedscheduler.yaml"})
        doc["configs"] = {path: (tree / path).read_text() for path in configs}
        doc = {"hived": {"repository": "microsoft/hivedscheduler", "commit": commit,
                         "unreadable": missing, "go": version}, **doc}
        args.out.write_text(dump(doc))
        print(f"wrote {args.out} (HiveD {commit[:12]}, {version})")
        return 0
    finally:
        if args.keep:
            print(f"build directory: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
