#!/usr/bin/env python3
"""Build a `Bootstrap: debootstrap` Apptainer definition file into an unpacked root file system, without
Apptainer: an emulation of `apptainer build` for debootstrap recipes only (no docker, library or oras
bases, no %setup, no multi-stage builds).

The result is a directory that Charliecloud runs as an image (`ch-run [flags] -b SRC:DST DIR -- CMD`).
The recipe is the definition file itself, parsed with spython: its %files are copied, its %post runs in
the bootstrapped tree (chroot, /proc and /dev mounted in a private mount namespace), its %environment,
%labels, %runscript and %test are written where Apptainer puts them (/.singularity.d/), its %environment
also as /ch/environment (for `ch-run --set-env`), and its %test runs last, as `apptainer build` runs it.
What this adds for Charliecloud, which cannot create mount points in an image: the bind targets of every
site profile's `[container] binds`, /work and /scratch.

Build host settings passed to %post (as a proxy would be): the host pip's index and find-links settings
(local directories bound read-only at the same path), and the host's wheels (scripts/bootstrap.sh's
Horovod wheel in ~/.cache/dlaunch/wheels, pip's built-wheel cache) as extra find-links, so the image's
pip installs them instead of downloading and compiling again.

Builds are cached in ~/.cache/dlaunch/rootfs/<stack>-<framework>-<arch>-<key> ($DLAUNCH_ROOTFS_CACHE), key =
sha256 of the recipe (labels excepted: they are rewritten on every run, with the build arguments) and the
architecture. %files are copied again on every run, so a cached build carries the trainer of this
checkout; a recipe whose %post consumed its %files would need --force.

    .venv/bin/python scripts/build-rootfs.py containers/cpu/ddp.def [--output images/cpu-ddp-x86_64]
        [--build-arg GIT_REVISION=...] [--force]
Prints the image directory. Needs root, mmdebstrap and spython.
"""
import argparse
import fcntl
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Dict, List, Tuple

from spython.main.parse.parsers import SingularityParser

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("DLAUNCH_ROOTFS_CACHE") or Path.home() / ".cache" / "dlaunch" / "rootfs")
HOST_WHEELS = [Path.home() / ".cache" / "dlaunch" / "wheels", Path.home() / ".cache" / "pip" / "wheels"]
BIND_TARGETS = ["/work", "/scratch"]
BUILD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
WHEELS_IN_ROOT = "/tmp/dlaunch-host-wheels"
FORMAT = "1"  # bump when the layout of a built tree changes: every cached build is then rebuilt


class BuildError(Exception):
    """A one-line reason the build cannot go on."""


class Recipe(SingularityParser):
    """spython's parser, told to accept `Bootstrap: debootstrap` (it only knows docker) and to keep %test
    as its own section (it otherwise appends `echo` lines for it to %post)."""

    def _check_bootstrap(self, line):
        self.bootstrap = line.split(":", 1)[1].strip().lower()

    def _test(self, lines):
        self.recipe[self.active_layer].test = list(lines)


def parse(text: str, path: Path) -> Tuple[Dict[str, str], object]:
    """Header keywords and spython's layer of a definition file's text."""
    header = {}
    for line in text.splitlines():
        if line.lstrip().startswith("%"):
            break
        match = re.match(r"^\s*([A-Za-z]+):\s*(.*?)\s*$", line)
        if match:
            header[match.group(1).lower()] = match.group(2)
    if header.get("bootstrap", "").lower() != "debootstrap":
        raise BuildError(f"{path}: Bootstrap: {header.get('bootstrap', '?')}: only debootstrap recipes are emulated")
    if "osversion" not in header or "mirrorurl" not in header:
        raise BuildError(f"{path}: a debootstrap recipe needs OSVersion and MirrorURL")
    with tempfile.NamedTemporaryFile("w", suffix=".def") as resolved:
        resolved.write(text)
        resolved.flush()
        parser = Recipe(resolved.name)
    layers = parser.recipe
    if len(layers) != 1:
        raise BuildError(f"{path}: multi-stage recipes are not emulated")
    return header, next(iter(layers.values()))


def section(text: str, name: str) -> List[str]:
    """A section's non-blank lines (for %arguments, which spython does not read)."""
    match = re.search(rf"^%{name}\s*$(.*?)(?=^%|\Z)", text, re.M | re.S)
    return [line.strip() for line in match.group(1).splitlines() if line.strip()] if match else []


def substitute(text: str, path: Path, build_args: Dict[str, str]) -> str:
    """Apptainer's `{{ NAME }}` build arguments: --build-arg, else %arguments' default."""
    values = dict(line.split("=", 1) for line in section(text, "arguments") if "=" in line)
    values.update(build_args)

    def value(match: re.Match) -> str:
        name = match.group(1)
        if name not in values:
            raise BuildError(f"{path}: build argument {name} has no value (--build-arg {name}=...)")
        return values[name]

    return re.sub(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", value, text)


def cache_key(text: str, arch: str) -> str:
    without_labels = re.sub(r"^%labels\s*$.*?(?=^%|\Z)", "", text, flags=re.M | re.S)
    return hashlib.sha256(f"{FORMAT}\n{arch}\n{without_labels}".encode()).hexdigest()[:16]


def host_pip_settings() -> Dict[str, str]:
    """The host pip's index-url, extra-index-url and find-links (`pip config list`, environment included)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    settings = {}
    for line in out.splitlines():
        match = re.match(r"^[^.]*\.(index-url|extra-index-url|find-links|cert)='(.*)'$", line)
        if match:
            settings[match.group(1)] = match.group(2)
    for key in ("index-url", "extra-index-url", "find-links", "cert"):
        if os.environ.get("PIP_" + key.upper().replace("-", "_")):
            settings[key] = os.environ["PIP_" + key.upper().replace("-", "_")]
    return settings


def local_dirs(settings: Dict[str, str]) -> List[Path]:
    """Host directories the pip settings point at (bound into the tree at the same path)."""
    found = []
    for value in settings.values():
        for item in value.split():
            path = Path(item[len("file://"):] if item.startswith("file://") else item)
            if path.is_absolute() and path.exists():
                top = Path("/", *path.parts[1:3])  # /opt/pypi/simple -> /opt/pypi (relative links leave simple/)
                found.append(top if top.is_dir() else path)
    return list(dict.fromkeys(found))


def collect_host_wheels(into: Path) -> int:
    """Hard links (copies across file systems) of the host's built wheels, flat, for --find-links."""
    into.mkdir(parents=True, exist_ok=True)
    count = 0
    for folder in HOST_WHEELS:
        for wheel in sorted(folder.rglob("*.whl")) if folder.is_dir() else []:
            target = into / wheel.name
            if target.exists():
                continue
            try:
                os.link(wheel, target)
            except OSError:
                shutil.copy2(wheel, target)
            count += 1
    return count


def site_bind_targets() -> List[str]:
    """Every bind destination in the site profiles (sites/*.toml, `[container] binds`)."""
    targets = []
    for profile in sorted((REPO / "sites").glob("*.toml")):
        try:
            binds = tomllib.loads(profile.read_text()).get("container", {}).get("binds", [])
        except (OSError, tomllib.TOMLDecodeError):
            continue
        for bind in binds:
            parts = str(bind).split(":")
            targets.append(parts[1] if len(parts) > 1 and parts[1] else parts[0])
    return targets


def run(argv: List[str], **kwargs) -> None:
    result = subprocess.run(argv, **kwargs)
    if result.returncode != 0:
        raise BuildError(f"{shlex.join(argv[:6])}{' ...' if len(argv) > 6 else ''} exited {result.returncode}")


def in_root(root: Path, script: str, env: Dict[str, str], binds: List[Path] = ()) -> None:
    """Run a shell script as root in the tree: private mount namespace, /proc, /dev and `binds` mounted."""
    mounts = ["set -e", f'mount -t proc proc {shlex.quote(str(root / "proc"))}',
              f'mount --rbind /dev {shlex.quote(str(root / "dev"))}']
    for path in binds:
        target = root / str(path).lstrip("/")
        mounts.append(f"mount --bind -o ro {shlex.quote(str(path))} {shlex.quote(str(target))}")
    (root / "tmp" / "dlaunch-step.sh").write_text(script + "\n")
    mounts.append(f"exec chroot {shlex.quote(str(root))} /bin/sh -e /tmp/dlaunch-step.sh")
    try:
        run(["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(mounts)], env=env)
    finally:
        (root / "tmp" / "dlaunch-step.sh").unlink(missing_ok=True)


def copy_files(root: Path, files: List[str], base: Path) -> None:
    """%files: `src [dst]` pairs, relative sources from `base` (the directory the build runs in)."""
    for line in files:
        parts = shlex.split(line)
        src = base / parts[0]
        dst = root / (parts[1] if len(parts) > 1 else parts[0]).lstrip("/")
        if not src.exists():
            raise BuildError(f"%files: {src} does not exist (run from the repository root)")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dst)


def environment_file(root: Path, env_script: str) -> str:
    """%environment evaluated in the tree: NAME=value lines for `ch-run --set-env` (only what it sets)."""
    env = {"PATH": BUILD_PATH, "HOME": "/root"}
    show = "env -0"
    before = subprocess.run(["chroot", str(root), "/bin/sh", "-c", show], env=env, capture_output=True, text=True)
    after = subprocess.run(["chroot", str(root), "/bin/sh", "-c", f"{env_script}\n{show}"], env=env,
                           capture_output=True, text=True)
    if after.returncode != 0:
        raise BuildError(f"%environment failed: {after.stderr.strip()[:200]}")
    old = dict(item.split("=", 1) for item in before.stdout.split("\0") if "=" in item)
    new = dict(item.split("=", 1) for item in after.stdout.split("\0") if "=" in item)
    return "".join(f"{k}={v}\n" for k, v in sorted(new.items()) if old.get(k) != v and k not in ("_", "SHLVL", "PWD"))


def write_metadata(root: Path, layer, labels: Dict[str, str]) -> None:
    """%labels, %environment, %runscript, %test where Apptainer keeps them, and /ch/environment."""
    meta = root / ".singularity.d"
    (meta / "env").mkdir(parents=True, exist_ok=True)
    env_script = "".join(f"export {line}\n" for line in layer.environ)
    (meta / "env" / "90-environment.sh").write_text("#!/bin/sh\n" + env_script)
    (meta / "labels.json").write_text(json.dumps(labels, indent=2) + "\n")
    for name, body in (("runscript", layer.cmd or ""), ("test", "\n".join(layer.test or []))):
        (meta / name).write_text(f"#!/bin/sh\n{body}\n")
        (meta / name).chmod(0o755)
    (root / "ch").mkdir(exist_ok=True)
    (root / "ch" / "environment").write_text(environment_file(root, env_script))


def labels_of(layer, path: Path, arch: str) -> Dict[str, str]:
    labels = {}
    for line in layer.labels:
        name, _, value = line.partition(" ")
        labels[name] = value.strip()
    labels["org.dlaunch.arch"] = arch
    labels["org.dlaunch.built-by"] = "scripts/build-rootfs.py (apptainer build emulation, debootstrap recipes)"
    labels["org.dlaunch.definition"] = str(path)
    labels["org.label-schema.build-date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return labels


def bootstrap(root: Path, header: Dict[str, str]) -> None:
    argv = ["mmdebstrap", "--quiet", "--variant=minbase", "--mode=root", "--format=directory"]
    if header.get("include"):
        argv.append("--include=" + ",".join(header["include"].replace(",", " ").split()))
    run(argv + [header["osversion"], str(root), header["mirrorurl"]])


def post(root: Path, layer) -> None:
    """%post in the tree, with the host's pip settings and wheels."""
    settings = host_pip_settings()
    wheels = root / WHEELS_IN_ROOT.lstrip("/")
    found = collect_host_wheels(wheels)
    print(f"build-rootfs: {found} host wheel(s) offered to pip", file=sys.stderr)
    settings["find-links"] = " ".join(filter(None, [settings.get("find-links", ""), WHEELS_IN_ROOT]))
    cert = settings.pop("cert", None)
    binds = local_dirs(settings)
    if cert and Path(cert).is_file():  # the host's CA bundle (a TLS-inspecting proxy's CA included)
        shutil.copy2(cert, wheels / "host-ca.crt")
        settings["cert"] = f"{WHEELS_IN_ROOT}/host-ca.crt"
    created = []
    for path in binds:
        target = root / str(path).lstrip("/")
        if not target.exists():
            created.append(target)
            target.mkdir(parents=True)
    env = {"PATH": BUILD_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TMPDIR": "/tmp", "MAKEFLAGS": f"-j{os.cpu_count()}"}
    env.update({"PIP_" + key.upper().replace("-", "_"): value for key, value in settings.items()})
    env.update({name: value for name, value in os.environ.items() if name.lower().endswith("_proxy")})
    shutil.copy2("/etc/resolv.conf", root / "etc" / "resolv.conf")
    try:
        in_root(root, "\n".join(layer.install), env, binds)
    finally:
        for target in created:
            while target != root and target.is_dir() and not any(target.iterdir()):
                target.rmdir()
                target = target.parent
        shutil.rmtree(wheels, ignore_errors=True)


def finish(root: Path, layer, labels: Dict[str, str]) -> None:
    """Metadata, bind targets, then %test (as `apptainer build` runs it, with %environment)."""
    for target in BIND_TARGETS + site_bind_targets():
        path = root / target.lstrip("/")
        if re.search(r"\.so(\.[0-9]+)*$", target):  # a bound library file needs a file to mount over
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        else:
            path.mkdir(parents=True, exist_ok=True)
    for name in ("etc/hosts", "etc/resolv.conf"):
        (root / name).touch()
    write_metadata(root, layer, labels)
    if layer.test:
        env = {"PATH": BUILD_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
        in_root(root, ". /.singularity.d/env/90-environment.sh\n" + "\n".join(layer.test), env)


def build(definition: Path, build_args: Dict[str, str], force: bool) -> Path:
    raw = definition.read_text()
    text = substitute(raw, definition, build_args)
    header, layer = parse(text, definition)
    arch = platform.machine()
    labels = labels_of(layer, definition, arch)
    name = f"{labels.get('org.dlaunch.stack', definition.parent.name)}-{labels.get('org.dlaunch.framework', definition.stem)}-{arch}"
    root = CACHE / f"{name}-{cache_key(text, arch)}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        complete = root / ".singularity.d" / "dlaunch-complete"
        if force or not complete.is_file():
            partial = root.with_name(root.name + ".partial")
            for stale in (partial, root):
                if stale.exists():
                    shutil.rmtree(stale)
            started = time.monotonic()
            bootstrap(partial, header)
            copy_files(partial, layer.files, Path.cwd())
            post(partial, layer)
            for leftover in ("var/cache/apt/archives", "tmp"):
                for item in (partial / leftover).glob("*"):
                    if item.is_file():
                        item.unlink()
                    elif item.is_dir() and item.name != "partial":
                        shutil.rmtree(item)
            finish(partial, layer, labels)
            (partial / ".singularity.d" / "dlaunch-complete").write_text(f"{time.monotonic() - started:.0f} s\n")
            partial.rename(root)
            for old in CACHE.glob(f"{name}-*"):
                if old != root and old.is_dir():
                    shutil.rmtree(old)
            print(f"build-rootfs: built {root} in {time.monotonic() - started:.0f} s", file=sys.stderr)
        else:
            copy_files(root, layer.files, Path.cwd())
            finish(root, layer, labels)
            print(f"build-rootfs: reused {root} (%files copied again, %test passed)", file=sys.stderr)
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("definition", type=Path)
    parser.add_argument("--output", type=Path, help="symbolic link to the image directory (e.g. images/cpu-ddp-x86_64)")
    parser.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--force", action="store_true", help="rebuild even when a cached build exists")
    args = parser.parse_args()
    try:
        if any("=" not in item for item in args.build_arg):
            raise BuildError("--build-arg: NAME=VALUE")
        if os.geteuid() != 0:
            raise BuildError("needs root (mmdebstrap --mode=root, chroot)")
        if not shutil.which("mmdebstrap"):
            raise BuildError("mmdebstrap is not installed (scripts/bootstrap-containers.sh)")
        root = build(args.definition, dict(item.split("=", 1) for item in args.build_arg), args.force)
    except BuildError as exc:
        print(f"build-rootfs: error: {exc}", file=sys.stderr)
        return 2
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        if args.output.is_symlink() or args.output.is_file():
            args.output.unlink()
        elif args.output.exists():
            print(f"build-rootfs: error: --output {args.output} exists and is not a link", file=sys.stderr)
            return 2
        args.output.symlink_to(root)
    print(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
