"""The peers that cannot share anatomy's environment, each in a virtual environment of its own that reuses this
python's torch. One builder for CI, the parity tests and `anatomy bench`:

    python -m anatomy.bench.peers circuit-tracer          # builds it when needed; prints its python
    eval "$(python -m anatomy.bench.peers --export)"      # every peer: export ANATOMY_..._PYTHON=... (.ci/run)

| peer           | variable                       | pins                                                       |
|----------------|--------------------------------|------------------------------------------------------------|
| transformers4  | ANATOMY_TRANSFORMERS4_PYTHON   | transformers 4.57.3 (it pins huggingface-hub < 1)           |
| circuit-tracer | ANATOMY_CIRCUIT_TRACER_PYTHON  | circuit-tracer 0.5.0, nnsight 0.6.1, transformer-lens 3.2.1 |
| auto-circuit   | ANATOMY_AUTOCIRCUIT_PYTHON     | auto-circuit 1.0.1, transformer-lens 2.18.0                 |
| saelens        | ANATOMY_SAELENS_PYTHON         | sae-lens 6.54.12 (it pins transformer-lens < 4)             |

Each is `python -m venv` under anatomy's cache (venv-<peer>) with a .pth file that appends this python's
site-packages, so torch, safetensors and numpy are this environment's (nothing downloaded twice; a second torch
would be a GB and minutes), and pip installs only the peer's pins, under a constraint that keeps torch this one.
The peer's own packages come first on its path: a pin shadows the base's version. A stamp file records what was
installed over which base packages; run again over the same base, the builder only re-points the .pth file (a CI
checkout moves) and installs nothing. An install that fails leaves no stamp, so the next run tries again.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shlex
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path


@dataclass(frozen=True)
class Peer:
    name: str  # as the rows and messages name it
    variable: str  # the environment variable that names its python instead
    packages: tuple[str, ...]
    why: str  # why it needs an environment of its own
    without_dependencies: tuple[str, ...] = ()  # installed with --no-deps: `packages` lists what they need


PEERS = {
    "transformers4": Peer("transformers 4.57.3", "ANATOMY_TRANSFORMERS4_PYTHON", ("transformers==4.57.3",),
                          "it pins huggingface-hub < 1 and tokenizers < 0.23"),
    "circuit-tracer": Peer("circuit-tracer", "ANATOMY_CIRCUIT_TRACER_PYTHON",
                           ("circuit-tracer==0.5.0", "nnsight==0.6.1", "transformer-lens==3.2.1",
                            "transformers==4.57.3"),
                           "it pins nnsight 0.6.1, transformer-lens 3 and transformers 4.57.3"),
    # auto-circuit's own dependencies but tracr-pypi, kaleido and word2word (jax, haiku and a Chromium: 700 MB and
    # two minutes of installing), which only its tracr tasks, image export and word lists import
    # (transformer-lens and transformers pinned: unpinned, pip's resolver downloads 25 versions of transformers)
    "auto-circuit": Peer("auto-circuit", "ANATOMY_AUTOCIRCUIT_PYTHON",
                         ("transformer-lens==2.18.0", "transformers==4.57.3", "pyarrow<16", "datasets<3",
                          "blobfile>=2.0.2", "einops>=0.6.1", "ordered-set>=4.1.0", "plotly>=5.18.0",
                          "vscode-tqdm>=4.66.2"),
                         "auto-circuit pins TransformerLens 2.x", without_dependencies=("auto-circuit==1.0.1",)),
    "saelens": Peer("SAELens", "ANATOMY_SAELENS_PYTHON", ("sae-lens==6.54.12",), "SAELens pins transformer-lens < 4"),
}
STAMP = "anatomy-peer.json"
PTH = "zz-anatomy-base.pth"


def venv_folder(peer: str) -> Path:
    from ..checkpoints.files import cache_root

    return cache_root() / f"venv-{peer}"


@functools.cache
def _base_packages() -> str:
    """A digest of this python's installed distributions (name and version): what the peer's pins were resolved
    against. A fresh CI environment with other versions re-runs pip; the same one does not."""
    found = sorted({f"{d.metadata['Name']}=={d.version}".lower() for d in metadata.distributions()
                    if d.metadata["Name"]})
    return hashlib.sha256("\n".join(found).encode()).hexdigest()[:16]


def build(peer: str, log=sys.stderr) -> Path:
    """The python of `peer`'s environment, made or brought up to date: made afresh when its pins or torch
    changed, pip run again when the base's packages changed, nothing but the .pth file re-pointed when its stamp
    matches. CalledProcessError with pip's output when an install fails."""
    spec = PEERS[peer]
    venv = venv_folder(peer)
    python, stamp = venv / "bin" / "python", venv / STAMP
    torch_version = metadata.version("torch").split("+")[0]
    wanted = {"packages": [*spec.without_dependencies, *spec.packages], "torch": torch_version,
              "base": _base_packages()}
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"venv-{peer}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two builds of one peer (two shells, two checkouts) take turns
        built = json.loads(stamp.read_text()) if stamp.is_file() else {}
        if not python.is_file() or {**built, "base": None} != {**wanted, "base": None}:
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True)
        site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        (site / PTH).write_text(sysconfig.get_paths()["purelib"] + "\n")
        if built == wanted:
            return python
        print(f"installing {' '.join(wanted['packages'])} into {venv} over this python's torch {torch_version}: "
              f"{spec.why}", file=log, flush=True)
        stamp.unlink(missing_ok=True)
        constraints = venv / "constraints.txt"
        constraints.write_text(f"torch=={torch_version}\n")  # never a second torch (PyPI's default is CUDA's)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", str(constraints)]
        commands = [[*pip, "--no-deps", *spec.without_dependencies]] if spec.without_dependencies else []
        for command in [*commands, [*pip, *spec.packages]]:
            # pip's resolver lists the base's packages that want other versions (sentence-transformers wants
            # transformers 5, ...): its output is shown only if the install fails
            run = subprocess.run(command, capture_output=True, text=True)
            if run.returncode != 0:
                raise subprocess.CalledProcessError(run.returncode, run.args, run.stdout, run.stderr)
        stamp.write_text(json.dumps(wanted))
    return python


def peer_python(peer: str, install: bool) -> tuple[str | None, str]:
    """(the python of `peer`'s environment, or None; what was done or why not): $variable if set, else the
    cache's environment, built (or brought up to date) when `install`. Never in --quick: CI builds its own
    before the tests (.ci/run), and a smoke test has no time for pip."""
    spec = PEERS[peer]
    given = os.environ.get(spec.variable)
    if given:
        if not Path(given).is_file():
            return None, f"${spec.variable}={given} is not a file"
        return given, f"{spec.name} from ${spec.variable}={given}"
    venv = venv_folder(peer)
    if not install:
        if (venv / STAMP).is_file():
            return str(venv / "bin" / "python"), f"{spec.name} from {venv}"
        return None, f"no {spec.name} environment (${spec.variable} unset, {venv} absent; --quick installs none)"
    try:
        return str(build(peer)), f"{spec.name} from {venv}"
    except (subprocess.SubprocessError, OSError) as error:
        detail = getattr(error, "stderr", "") or ""
        return None, f"could not install {spec.name} into {venv}: {type(error).__name__} {detail[-200:]}"


def main(argv: list[str] | None = None) -> int:
    """Build the peers named (all when none is), side by side: pip mostly waits on the network."""
    import argparse
    import time
    from concurrent.futures import ThreadPoolExecutor

    parser = argparse.ArgumentParser(prog="python -m anatomy.bench.peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("peers", nargs="*", metavar="PEER", help=f"which ({', '.join(PEERS)}); all when none is named")
    parser.add_argument("--export", action="store_true", help="print `export VARIABLE=python` lines for a shell's eval")
    args = parser.parse_args(argv)
    unknown = [peer for peer in args.peers if peer not in PEERS]
    if unknown:
        parser.error(f"no peer {unknown[0]!r}; the peers: {', '.join(PEERS)}")

    def timed(peer: str) -> tuple[Path, float]:
        start = time.perf_counter()
        return build(peer), time.perf_counter() - start

    names = args.peers or list(PEERS)
    with ThreadPoolExecutor(len(names)) as pool:
        futures = {peer: pool.submit(timed, peer) for peer in names}
    failed = False
    for peer, future in futures.items():
        try:
            python, seconds = future.result()
        except subprocess.CalledProcessError as error:
            print(f"could not install {PEERS[peer].name}: {(error.stdout or '')[-3000:]}{(error.stderr or '')[-3000:]}",
                  file=sys.stderr)
            failed = True
            continue
        print(f"{PEERS[peer].name}: {python} ({seconds:.1f} s)", file=sys.stderr)
        print(f"export {PEERS[peer].variable}={shlex.quote(str(python))}" if args.export else python)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
