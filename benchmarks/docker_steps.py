"""The Dockerfile, built and run without a Docker engine: its stages replayed in chroots of a clean,
debootstrapped Debian bookworm (minbase), then the image's default command, `nas serve` and the
sandbox's bubblewrap checked in the runtime stage's root.

    sudo python benchmarks/docker_steps.py            # ~20-40 min on 2 cores; root, Linux, network to
                                                      # deb.debian.org and PyPI (or the host's pip mirrors)
    python benchmarks/docker_steps.py --keep          # leave the roots in the work dir to look at

What it does, step by step (each timed, pass/fail, in benchmarks/results/docker_steps.json):
  1. `apt-get install debootstrap` if missing (after one `apt-get update`);
  2. `debootstrap --variant=minbase bookworm` into a temp dir (.debs kept in /var/cache/nasflow-debootstrap);
  3. the base image: python:3.11-slim-bookworm is Debian bookworm-slim plus Python 3.11 built in
     /usr/local; here it is Debian's own python3 (3.11.2), python3-venv, ca-certificates, netbase, tzdata;
  4. every stage of the Dockerfile from a copy of that base: ENV, ARG, WORKDIR, USER, COPY (the
     build context filtered by .dockerignore; --from=STAGE from that stage's root; --chown) and RUN
     (`/bin/sh -c` as the stage's user, in its WORKDIR, with its environment; RUN --mount: type=bind
     from another stage, type=cache). Each step runs in its own mount and PID namespace with the
     root pivoted in (`unshare --mount --pid --fork --kill-child`, then `pivot_root`), /proc, /dev
     and /sys mounted there and the host's resolv.conf bound in, so every mount and process of a
     step ends with it, whatever happens; the work dir is deleted at the end only after checking
     that nothing is mounted under it;
  5. in the runtime root, as the image's user, with the image's environment and WORKDIR: the default
     command (ENTRYPOINT + CMD, the NB201 table search); `nas serve --help`; `nas serve` against a
     `prefect server` with a deployment run of the table search to completion; `bwrap --version`;
     the sandbox's own probe (bubblewrap in fresh user/PID/... namespaces, as the non-root user) with
     /proc unmasked (Docker's `--security-opt systempaths=unconfined`) and with Docker's default
     masked /proc paths (expected: refused in one line; with NASFLOW_ALLOW_UNISOLATED=1 it runs);
     that the runtime root has no C/C++ compiler.

Caching (said per step in the JSON): the type=cache pip mount is a copy of the host's pip wheel
cache (~/.cache/pip/wheels: the llama-cpp-python wheel built once on this host is reused, so the
build stage does not compile llama.cpp), and the host's pip configuration (its local mirrors of
PyPI, e.g. torch's wheels) is bound into the RUN steps; `--no-host-pip` uses PyPI alone and
`--no-pip-cache` an empty cache (the llama.cpp compile, ~6+ min).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "benchmarks" / "results" / "docker_steps.json"
MIRROR = "http://deb.debian.org/debian"
DEB_CACHE = Path("/var/cache/nasflow-debootstrap")
SUITE = "bookworm"
DOCKER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What python:3.11-slim-bookworm adds to debian:bookworm-slim, as Debian packages.
BASE_PACKAGES = ["python3", "python3-venv", "ca-certificates", "netbase", "tzdata"]
BASE_ENV = {"PATH": DOCKER_PATH, "LANG": "C.UTF-8"}
# Docker's default masked and read-only /proc paths (moby's oci defaults).
MASKED = ["/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
          "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"]
READ_ONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
NOT_CHECKED = [
    "the real python:3.11-slim-bookworm base image (Docker Hub is not reachable here): the base is Debian "
    "bookworm's own python3 3.11.2 in /usr/bin with python3-venv, where the image has Python 3.11.x built "
    "in /usr/local; the Dockerfile uses a venv in both stages so that either base runs the same steps",
    "a Docker engine or BuildKit: layer caching, the build context upload, `# syntax=` frontends, "
    "VOLUME/ENTRYPOINT/CMD metadata (the replay runs ENTRYPOINT + CMD itself), image size in layers",
    "the non-root user's namespaces under a real engine: Docker's default seccomp profile (refuses "
    "unshare(CLONE_NEWUSER)) and AppArmor profile; only Docker's masked /proc paths are reproduced here, "
    "so `--security-opt seccomp=unconfined` / `apparmor=unconfined` are documented, not tested",
    "CMAKE_ARGS=-DGGML_NATIVE=OFF and the llama.cpp compile itself when the pip cache holds the "
    "llama-cpp-python wheel (the host's wheel, built with llama.cpp's defaults, is then reused)",
    "TORCH_INDEX_URL (download.pytorch.org is not reachable here): the replay builds with PyPI's torch",
    "a Docker or Kubernetes Prefect work pool running the image (`prefect deploy` with prefect-docker or "
    "prefect-kubernetes); `nas serve` inside the runtime root is checked instead",
    "podman/buildah, other architectures than x86_64, GPUs in the container",
]


# ---------------------------------------------------------------------------------------------
# The Dockerfile and .dockerignore


@dataclass
class Instr:
    line: int
    op: str
    args: str  # the rest of the instruction, continuation lines joined
    flags: dict[str, list[str]] = field(default_factory=dict)

    def short(self, n: int = 90) -> str:
        text = " ".join(self.args.split())
        return f"{self.op} {text[:n]}{'...' if len(text) > n else ''}"


@dataclass
class Stage:
    index: int
    base: str
    name: str | None
    instrs: list[Instr] = field(default_factory=list)


def parse_dockerfile(text: str) -> tuple[list[Instr], list[Stage]]:
    """(global ARGs before the first FROM, the stages); comments, parser directives and
    line continuations handled as Docker's parser does (comment lines inside a continuation dropped)."""
    instrs: list[Instr] = []
    buf: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf.append(stripped[:-1])
            continue
        buf.append(stripped)
        joined = " ".join(part.strip() for part in buf if part.strip())
        buf = []
        op, _, rest = joined.partition(" ")
        flags: dict[str, list[str]] = {}
        rest = rest.strip()
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            key, _, value = flag[2:].partition("=")
            flags.setdefault(key, []).append(value)
            rest = rest.strip()
        instrs.append(Instr(start, op.upper(), rest, flags))
    globals_: list[Instr] = []
    stages: list[Stage] = []
    for ins in instrs:
        if ins.op == "FROM":
            parts = ins.args.split()
            name = parts[2] if len(parts) == 3 and parts[1].lower() == "as" else None
            stages.append(Stage(len(stages), parts[0], name))
        elif not stages:
            if ins.op != "ARG":
                raise ValueError(f"Dockerfile line {ins.line}: {ins.op} before FROM")
            globals_.append(ins)
        else:
            stages[-1].instrs.append(ins)
    return globals_, stages


_VAR = re.compile(r"\$(?:\{(\w+)(?::([-+])([^}]*))?\}|(\w+))")


def expand(text: str, env: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(4)
        value = env.get(name, "")
        if m.group(2) == "-":
            return value or m.group(3)
        if m.group(2) == "+":
            return m.group(3) if value else ""
        return value
    return _VAR.sub(sub, text)


def parse_assignments(args: str, env: dict[str, str]) -> dict[str, str]:
    """ENV/ARG `k=v k2="v 2"` (values expanded against `env` as they are read) or legacy `ENV k v`."""
    tokens = shlex.split(args, posix=True)
    if tokens and "=" not in tokens[0]:
        if len(tokens) == 1:  # ARG NAME without a default
            return {tokens[0]: env.get(tokens[0], "")}
        return {tokens[0]: expand(" ".join(tokens[1:]), env)}
    out: dict[str, str] = {}
    for token in tokens:
        key, _, value = token.partition("=")
        out[key] = expand(value, {**env, **out})
    return out


def exec_form(args: str) -> list[str]:
    args = args.strip()
    if args.startswith("["):
        return list(json.loads(args))
    return ["/bin/sh", "-c", args]


def _pattern_regex(pattern: str) -> re.Pattern:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


class DockerIgnore:
    """Docker's rules: the last pattern that matches a path or one of its parent dirs decides."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern]] = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
            self.rules.append((negate, _pattern_regex(pattern)))

    def excluded(self, rel: str) -> bool:
        parts = rel.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        result = False
        for negate, rx in self.rules:
            if any(rx.match(p) for p in prefixes):
                result = not negate
        return result


# ---------------------------------------------------------------------------------------------
# Running a command in a root


@dataclass
class Mount:
    source: str  # a host path
    target: str  # inside the root
    read_only: bool = True


class Runner:
    def __init__(self, work: Path, log_dir: Path, echo: bool = True) -> None:
        self.work = work
        self.log_dir = log_dir
        self.echo = echo
        self.count = 0

    def run(self, root: Path, argv: list[str], *, env: dict[str, str], user: str = "root", workdir: str = "/",
            mounts: tuple[Mount, ...] = (), mask_proc: bool = False, own_net: bool = False,
            timeout: float = 3600, name: str = "step") -> tuple[int, str, Path]:
        """`argv` in `root` (pivoted in, own mount + PID namespace): (exit code, output tail, log path)."""
        self.count += 1
        log = self.log_dir / f"{self.count:03d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[:60]}.log"
        created: list[Path] = []
        for m in [*mounts, Mount("/etc/resolv.conf", "/etc/resolv.conf")]:
            target = root / m.target.lstrip("/")
            if not target.exists() and not target.is_symlink():
                # mount points that the step needs (removed after it, as Docker leaves none in a layer)
                missing = [p for p in [target, *target.parents] if not p.exists() and root in p.parents]
                created.extend(missing)
                if Path(m.source).is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.touch()
        uid, gid, home = user_ids(root, user)
        full_env = {"HOSTNAME": "nasflow-replay", "HOME": home, **env}
        setup = ["set -e", 'R="$1"; W="$2"; shift 2',
                 'mount --make-rprivate /',
                 *(["ip link set lo up"] if own_net else []),
                 'mount --rbind "$R" "$R"',
                 'mount -t proc proc "$R/proc"',
                 'mount --rbind /dev "$R/dev"',
                 'mount -t sysfs -o ro sysfs "$R/sys" 2>/dev/null || true']
        for m in [*mounts, Mount("/etc/resolv.conf", "/etc/resolv.conf")]:
            dst = shlex.quote(str(root / m.target.lstrip("/")))
            setup.append(f"mount --bind {shlex.quote(m.source)} {dst}")
            if m.read_only:
                setup.append(f"mount -o remount,bind,ro {dst}")
        if mask_proc:  # as Docker does without --security-opt systempaths=unconfined
            for path in MASKED:
                dst = shlex.quote(str(root / path.lstrip("/")))
                setup.append(f"if [ -d {dst} ]; then mount -t tmpfs -o ro tmpfs {dst}; "
                             f"elif [ -e {dst} ]; then mount --bind /dev/null {dst}; fi")
            for path in READ_ONLY:
                dst = shlex.quote(str(root / path.lstrip("/")))
                setup.append(f"if [ -e {dst} ]; then mount --bind {dst} {dst} && "
                             f"mount -o remount,bind,ro {dst}; fi")
        setup += ['cd "$R"', "pivot_root . .", "umount -l .", 'cd "$W"']
        prefix = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in full_env.items())]
        if uid != 0:
            prefix += ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", "--"]
        setup.append('exec "$@"')
        cmd = ["unshare", "--mount", "--pid", *(["--net"] if own_net else []), "--fork", "--kill-child", "--",
               "/bin/sh", "-c", "\n".join(setup),
               "sh", str(root), workdir, *prefix, *argv]
        with log.open("wb") as f:
            f.write(f"$ {shlex.join(argv)}\n(user {user}, workdir {workdir})\n".encode())
            f.flush()
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # --kill-child: the namespace's processes go with it
                proc.wait()
                rc = 124
            except BaseException:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
        for path in sorted(created, key=lambda p: len(p.parts), reverse=True):
            if path.is_dir() and not path.is_symlink():
                try:
                    path.rmdir()
                except OSError:
                    pass
            elif path.is_file() and path.stat().st_size == 0:
                path.unlink()
        return rc, tail(log), log


def tail(path: Path, n: int = 2500) -> str:
    data = path.read_bytes()
    return data[-n:].decode("utf-8", "replace")


def user_ids(root: Path, user: str) -> tuple[int, int, str]:
    name, _, group = user.partition(":")
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if len(fields) >= 7 and (fields[0] == name or fields[2] == name):
            gid = int(fields[3])
            if group:
                gid = group_id(root, group)
            return int(fields[2]), gid, fields[5]
    if name.isdigit():
        return int(name), int(group or name), "/"
    raise ValueError(f"no user {name!r} in {root}/etc/passwd")


def group_id(root: Path, group: str) -> int:
    if group.isdigit():
        return int(group)
    for line in (root / "etc/group").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == group:
            return int(fields[2])
    raise ValueError(f"no group {group!r} in {root}/etc/group")


def mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve())
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            out.append(point)
    return out


# ---------------------------------------------------------------------------------------------
# The replay


class Replay:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.steps: list[dict[str, Any]] = []
        self.cached: list[str] = []
        self.built: list[str] = []
        self.work = Path(tempfile.mkdtemp(prefix="nasflow-docker-steps-", dir=args.work_dir))
        # the logs outlive the work dir (a failed step's log is named in the JSON)
        self.logs = Path(tempfile.mkdtemp(prefix="nasflow-docker-steps-logs-", dir=args.work_dir))
        self.runner = Runner(self.work, self.logs)
        self.roots: dict[str, Path] = {}
        self.stage_state: dict[str, dict[str, Any]] = {}
        self.pip_mounts: list[Mount] = []
        self.pip_env: dict[str, str] = {}
        self.results: dict[str, Any] = {}

    # -- bookkeeping
    def step(self, name: str, fn, *, cached: str | None = None) -> Any:
        print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
        start = time.monotonic()
        record: dict[str, Any] = {"step": name}
        self.steps.append(record)
        try:
            detail = fn()
            record["ok"] = True
            if detail:
                record["detail"] = detail
            return detail
        except StepFailed as exc:
            record["ok"] = False
            record["detail"] = str(exc)
            raise
        except Exception as exc:
            record["ok"] = False
            record["detail"] = f"{type(exc).__name__}: {exc}"
            raise StepFailed(str(exc)) from exc
        finally:
            record["seconds"] = round(time.monotonic() - start, 1)
            if cached:
                record.setdefault("cached", cached)
            print(f"    {'ok' if record.get('ok') else 'FAILED'} in {record['seconds']} s"
                  + ("" if record.get("ok") else f": {str(record.get('detail'))[-1500:]}"), flush=True)

    def sh(self, root: Path, script: str, **kw: Any) -> str:
        rc, out, log = self.runner.run(root, ["/bin/sh", "-c", script], **kw)
        if rc != 0:
            raise StepFailed(f"exit {rc} ({log}):\n{out}")
        return out

    # -- 1-3: debootstrap and the base
    def ensure_debootstrap(self) -> str:
        if shutil.which("debootstrap"):
            return "already installed"
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "debootstrap"], check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        return "installed with apt-get"

    def debootstrap(self) -> dict[str, Any]:
        DEB_CACHE.mkdir(parents=True, exist_ok=True)
        before = len(list(DEB_CACHE.glob("*.deb")))
        base = self.work / "base"
        log = self.logs / "000-debootstrap.log"
        # its own mount namespace (the /proc, /sys it mounts in the target end with it) and session
        cmd = ["unshare", "--mount", "--kill-child", "--fork", "--", "debootstrap", "--variant=minbase",
               f"--cache-dir={DEB_CACHE}", SUITE, str(base), MIRROR]
        with log.open("wb") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(1800)
            except BaseException:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
        if rc != 0:
            raise StepFailed(f"debootstrap exit {rc}:\n{tail(log)}")
        self.roots["base"] = base
        self.steps[-1]["cached"] = (f"{before} .debs already in {DEB_CACHE} (a rerun downloads none)"
                                    if before else f"none: downloaded into {DEB_CACHE}")
        return {"root": "debootstrap --variant=minbase bookworm", "size_mb": du_mb(base)}

    def base_image(self) -> dict[str, Any]:
        base = self.roots["base"]
        (base / "etc/apt/sources.list").write_text(
            f"deb {MIRROR} {SUITE} main\ndeb {MIRROR} {SUITE}-updates main\n"
            f"deb http://deb.debian.org/debian-security {SUITE}-security main\n")
        out = self.sh(base, "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                      "--no-install-recommends " + " ".join(BASE_PACKAGES)
                      + " >/dev/null && rm -rf /var/lib/apt/lists/* && python3 --version",
                      env=BASE_ENV, name="base")
        version = out.strip().splitlines()[-1]
        return {"python": version, "packages": BASE_PACKAGES, "size_mb": du_mb(base),
                "stands_for": "python:3.11-slim-bookworm (Debian's python3 in /usr/bin, not Python built in "
                              "/usr/local as in the real image)"}

    # -- 4: the stages
    def setup_pip(self) -> dict[str, Any]:
        info: dict[str, Any] = {}
        cache = self.work / "pip-cache"
        cache.mkdir()
        host_wheels = Path(self.args.pip_cache).expanduser() / "wheels"
        if not self.args.no_pip_cache and host_wheels.is_dir():
            shutil.copytree(host_wheels, cache / "wheels")
            info["pip_cache"] = (f"a copy of {host_wheels} ({du_mb(cache)} MB, "
                                 f"{len(list(cache.rglob('*.whl')))} built wheels) as the type=cache mount")
        else:
            info["pip_cache"] = "empty"
        self.cache_dir = cache
        if not self.args.no_host_pip:
            conf = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                                  text=True).stdout
            seen: set[str] = set()
            for line in conf.splitlines():
                key, _, value = line.partition("=")
                option = key.rpartition(".")[2]
                value = value.strip().strip("'\"")
                if option == "cert" and Path(value).is_file():  # e.g. a proxy's CA: the image's bundle lacks it
                    self.pip_env["PIP_CERT"] = "/run/host-pip-ca.crt"
                    self.pip_mounts.append(Mount(value, "/run/host-pip-ca.crt"))
                    continue
                if option not in ("find-links", "extra-index-url", "index-url"):
                    continue
                env_key = "PIP_" + option.upper().replace("-", "_")
                self.pip_env[env_key] = value
                for item in value.split():
                    path = item.removeprefix("file://")
                    if path.startswith("/"):
                        top = "/" + Path(path).parts[1] + "/" + Path(path).parts[2] if len(Path(path).parts) > 2 \
                            else path
                        if Path(top).exists() and top not in seen:
                            seen.add(top)
                            self.pip_mounts.append(Mount(top, top))
            info["host_pip"] = {"env": self.pip_env, "mounted": sorted(m.source for m in self.pip_mounts)}
        else:
            info["host_pip"] = "off: PyPI only"
        return info

    def run_stage(self, stage: Stage, global_args: dict[str, str]) -> None:
        label = stage.name or str(stage.index)
        base = expand(stage.base, global_args)
        root = self.work / f"stage-{label}"
        if base in self.roots or base in self.stage_state:
            source = self.roots[base]
            from_env = dict(self.stage_state[base]["env"])
        elif re.fullmatch(r"python:3\.11(\.\d+)?-slim(-bookworm)?", base):
            source = self.roots["base"]
            from_env = dict(BASE_ENV)
        else:
            raise StepFailed(f"FROM {base}: only python:3.11-slim[-bookworm] and earlier stages are replayed")

        def copy_base() -> dict[str, Any]:
            subprocess.run(["cp", "-a", "--reflink=auto", str(source), str(root)], check=True)
            return {"from": base, "replayed_as": source.name}
        self.step(f"{label}: FROM {base}", copy_base)
        self.roots[label] = root
        state = {"env": from_env, "args": {}, "user": "root", "workdir": "/", "entrypoint": [], "cmd": [],
                 "volumes": []}
        self.stage_state[label] = state
        for ins in stage.instrs:
            self.step(f"{label}:{ins.line} {ins.short()}", lambda ins=ins: self.instr(root, state, ins, global_args))

    def instr(self, root: Path, state: dict[str, Any], ins: Instr, global_args: dict[str, str]) -> Any:
        env, args = state["env"], state["args"]
        scope = {**args, **env}
        if ins.op == "ENV":
            env.update(parse_assignments(ins.args, scope))
            return None
        if ins.op == "ARG":
            for key, value in parse_assignments(ins.args, {**global_args, **scope}).items():
                args[key] = self.args.build_arg.get(key, value or global_args.get(key, ""))
            return None
        if ins.op == "WORKDIR":
            path = expand(ins.args.strip(), scope)
            state["workdir"] = os.path.normpath(os.path.join(state["workdir"], path))
            (root / state["workdir"].lstrip("/")).mkdir(parents=True, exist_ok=True)
            return None
        if ins.op == "USER":
            state["user"] = expand(ins.args.strip(), scope)
            user_ids(root, state["user"])
            return None
        if ins.op in ("VOLUME", "EXPOSE", "LABEL", "STOPSIGNAL", "HEALTHCHECK", "SHELL"):
            if ins.op == "VOLUME":
                state["volumes"] = exec_form(ins.args) if ins.args.strip().startswith("[") else ins.args.split()
                for vol in state["volumes"]:  # Docker creates the volume's mount point
                    (root / vol.lstrip("/")).mkdir(parents=True, exist_ok=True)
            return None
        if ins.op in ("ENTRYPOINT", "CMD"):
            state[ins.op.lower()] = exec_form(ins.args)
            if ins.op == "ENTRYPOINT":
                state["cmd"] = []
            return None
        if ins.op == "COPY":
            return self.copy(root, state, ins, scope)
        if ins.op == "RUN":
            return self.run(root, state, ins)
        raise StepFailed(f"{ins.op} is not replayed")

    def copy(self, root: Path, state: dict[str, Any], ins: Instr, scope: dict[str, str]) -> Any:
        parts = [expand(p, scope) for p in shlex.split(ins.args)]
        *sources, dest = parts
        from_stage = (ins.flags.get("from") or [None])[0]
        chown = (ins.flags.get("chown") or [None])[0]
        owner = None
        if chown:
            user, _, group = chown.partition(":")
            uid, gid, _ = user_ids(root, user)
            owner = (uid, group_id(root, group) if group else gid)
        dest_abs = os.path.normpath(os.path.join(state["workdir"], dest))
        target = root / dest_abs.lstrip("/")
        to_dir = dest.endswith("/") or len(sources) > 1
        ignore = None
        context = ROOT
        if from_stage:
            context = self.roots[from_stage]
        elif (ROOT / ".dockerignore").exists():
            ignore = DockerIgnore((ROOT / ".dockerignore").read_text())
        copied = 0
        for src in sources:
            src_path = context / src.lstrip("/")
            rel_top = os.path.normpath(src.lstrip("/"))
            if ignore and ignore.excluded(rel_top):
                raise StepFailed(f"COPY {src}: excluded by .dockerignore")
            if not src_path.exists():
                raise StepFailed(f"COPY {src}: not in the {'stage ' + from_stage if from_stage else 'build context'}")
            if src_path.is_dir():
                for dirpath, dirnames, filenames in os.walk(src_path):
                    rel_dir = os.path.relpath(dirpath, src_path)
                    dirnames[:] = [d for d in dirnames if not (ignore and ignore.excluded(
                        os.path.normpath(os.path.join(rel_top, rel_dir, d))))]
                    out_dir = target / rel_dir if rel_dir != "." else target
                    out_dir.mkdir(parents=True, exist_ok=True)
                    if owner:
                        os.chown(out_dir, *owner)
                    for name in filenames:
                        if ignore and ignore.excluded(os.path.normpath(os.path.join(rel_top, rel_dir, name))):
                            continue
                        out = out_dir / name
                        shutil.copy2(os.path.join(dirpath, name), out, follow_symlinks=False)
                        if owner:
                            os.chown(out, *owner, follow_symlinks=False)
                        copied += 1
            else:
                out = target / src_path.name if to_dir or target.is_dir() else target
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src_path, out)
                if owner:
                    os.chown(out, *owner)
                copied += 1
        return {"files": copied}

    def run(self, root: Path, state: dict[str, Any], ins: Instr) -> Any:
        mounts: list[Mount] = list(self.pip_mounts)
        env = {**state["args"], **state["env"], **self.pip_env}
        used: list[str] = []
        for spec in ins.flags.get("mount", []):
            opts = dict(item.partition("=")[::2] for item in spec.split(","))
            kind = opts.get("type", "bind")
            target = opts.get("target") or opts.get("dst") or opts.get("destination")
            if kind == "cache":
                mounts.append(Mount(str(self.cache_dir), target, read_only=False))
                used.append(f"cache {target} <- {self.cache_dir.name} (a copy of the host's pip wheel cache)")
            elif kind == "bind":
                source_root = self.roots[opts["from"]] if "from" in opts else ROOT
                source = source_root / opts.get("source", opts.get("src", "")).lstrip("/")
                mounts.append(Mount(str(source), target, read_only="rw" not in opts and "readwrite" not in opts))
                used.append(f"bind {target} <- {opts.get('from', 'context')}:{opts.get('source', '/')}")
            else:
                raise StepFailed(f"RUN --mount=type={kind} is not replayed")
        argv = exec_form(ins.args)
        rc, out, log = self.runner.run(root, argv, env=env, user=state["user"], workdir=state["workdir"],
                                       mounts=tuple(mounts), name=f"{ins.line}-{ins.op}",
                                       timeout=self.args.step_timeout)
        text = log.read_text(errors="replace")
        hits = [f"{m.group(1)}=={m.group(2)}" for m in re.finditer(r"Using cached (\S+?)-(\d[^-]*)-\S*\.whl", text)]
        built = [m.group(1) for m in re.finditer(r"Building wheel for (\S+) ", text)]
        self.cached += hits
        self.built += built
        if rc != 0:
            raise StepFailed(f"exit {rc} ({log}):\n{out}")
        detail: dict[str, Any] = {"log": log.name}
        local = len(re.findall(r"^Processing /(?!src)", text, re.M))
        if hits or built or local:
            detail["pip"] = {"built_from_cache": hits, "built_here": built, "from_host_mirrors": local,
                             "downloaded": len(re.findall(r"^\s*Downloading ", text, re.M))}
            self.steps[-1]["cached"] = (f"pip: {len(hits)} built wheel(s) from the pip cache ({', '.join(hits)}), "
                                        f"{local} wheels from the host's mirrors, {len(built)} built here")
        apt = len(re.findall(r"^Get:\d+ ", text, re.M))
        if apt:
            detail["apt_downloads"] = apt
            self.steps[-1]["cached"] = f"no: {apt} apt downloads from deb.debian.org"
        if used:
            detail["mounts"] = used
        return detail

    # -- 5: the image, run
    def image_env(self, state: dict[str, Any]) -> dict[str, str]:
        return dict(state["env"])

    def checks(self, label: str) -> None:
        root = self.roots[label]
        state = self.stage_state[label]
        user, workdir, env = state["user"], state["workdir"], self.image_env(state)

        def run(*a: Any, mask_proc: bool = True, **kw: Any) -> tuple[int, str, Path]:
            # as `docker run` does by default: its own network namespace (loopback only here) and
            # Docker's masked /proc paths; the unmasked probe below turns the latter off
            return self.runner.run(*a, mask_proc=mask_proc, own_net=True, **kw)
        self.results["image"] = {"user": user, "workdir": workdir, "entrypoint": state["entrypoint"],
                                 "cmd": state["cmd"], "volumes": state["volumes"], "env": env}

        def default_command() -> dict[str, Any]:
            runs = root / "app/runs"
            before = set(runs.iterdir()) if runs.is_dir() else set()
            argv = [*state["entrypoint"], *state["cmd"]]
            rc, out, log = run(root, argv, env=env, user=user, workdir=workdir, name="default-cmd",
                               timeout=1200)
            if rc != 0:
                raise StepFailed(f"exit {rc} ({log}):\n{out}")
            new = sorted(set(runs.iterdir()) - before) if runs.is_dir() else []
            summaries = [json.loads((d / "summary.json").read_text()) for d in new if (d / "summary.json").exists()]
            if len(summaries) != 1:
                raise StepFailed(f"expected one new run dir with summary.json under /app/runs, got {new}")
            summary = summaries[0]
            want = next((int(a.split("=")[1]) for a in argv if a.startswith("budget.trials=")), None)
            if want is not None and summary.get("trials") != want:
                raise StepFailed(f"summary.json trials {summary.get('trials')} != {want}")
            owner = new[0].stat().st_uid
            return {"argv": argv, "run_dir": "/" + str(new[0].relative_to(root)), "trials": summary.get("trials"),
                    "best": {k: summary.get(k) for k in ("best_accuracy", "best_key", "best") if k in summary},
                    "run_dir_uid": owner, "output_tail": out[-600:]}
        self.step("runtime: default command (ENTRYPOINT + CMD) as the image's user", default_command)

        def serve_help() -> dict[str, Any]:
            rc, out, log = run(root, ["nas", "serve", "--help"], env=env, user=user, workdir=workdir,
                               name="serve-help", timeout=300)
            if rc != 0 or "usage" not in out.lower():
                raise StepFailed(f"exit {rc} ({log}):\n{out}")
            return {"output_head": out.split("\n", 2)[-1][:300]}
        self.step("runtime: nas serve --help", serve_help)

        if not self.args.no_serve:
            def serve() -> dict[str, Any]:
                checks = self.work / "checks"
                checks.mkdir(exist_ok=True)
                script = checks / "serve_check.py"
                script.write_text(SERVE_CHECK)
                port = free_port()
                rc, out, log = run(root, ["python3", "/run/docker-steps/serve_check.py", str(port)], env=env,
                                   user=user, workdir=workdir, mounts=(Mount(str(checks), "/run/docker-steps"),),
                                   name="serve", timeout=900)
                if rc != 0:
                    raise StepFailed(f"exit {rc} ({log}):\n{out}")
                return json.loads(out.strip().splitlines()[-1])
            self.step("runtime: nas serve with a prefect server; a deployment run of the table search", serve)

        def bwrap_version() -> dict[str, Any]:
            rc, out, log = run(root, ["bwrap", "--version"], env=env, user=user, workdir=workdir, name="bwrap")
            if rc != 0:
                raise StepFailed(f"exit {rc} ({log}):\n{out}")
            return {"bwrap": out.strip().splitlines()[-1]}
        self.step("runtime: bwrap --version (Debian's bubblewrap on PATH)", bwrap_version)

        probe = ("import logging; logging.basicConfig(level=logging.WARNING); "
                 "from nas.sandbox.isolation import isolation; print(isolation().describe())")

        def sandbox_unmasked() -> dict[str, Any]:
            rc, out, log = run(root, ["python3", "-c", probe], env=env, user=user, workdir=workdir,
                               mask_proc=False, name="sandbox-unmasked")
            if rc != 0 or "bubblewrap namespaces" not in out:
                raise StepFailed(f"exit {rc} ({log}):\n{out}")
            return {"isolation": out.strip().splitlines()[-1],
                    "as": "docker run --security-opt systempaths=unconfined (and seccomp/apparmor that allow "
                          "user namespaces)"}
        self.step("runtime: the sandbox's probe as the non-root user, /proc unmasked", sandbox_unmasked)

        def sandbox_masked() -> dict[str, Any]:
            rc, out, log = run(root, ["python3", "-c", probe], env=env, user=user, workdir=workdir,
                               name="sandbox-masked")
            refused = rc != 0 and "OS isolation is unavailable" in out
            rc2, out2, log2 = run(root, ["python3", "-c", probe], env={**env, "NASFLOW_ALLOW_UNISOLATED": "1"},
                                  user=user, workdir=workdir, name="sandbox-masked-allowed")
            allowed = rc2 == 0 and "UNISOLATED" in out2
            if not (refused and allowed):
                raise StepFailed(f"refused={refused} ({log}): {out[-800:]}\nallowed={allowed} ({log2}): {out2[-800:]}")
            line = next((l for l in out.splitlines() if "OS isolation is unavailable" in l), "")
            return {"refused": line.strip()[-400:], "with_NASFLOW_ALLOW_UNISOLATED=1": out2.strip().splitlines()[-1],
                    "as": "docker run with Docker's default masked /proc paths"}
        self.step("runtime: the sandbox's probe with Docker's masked /proc (expected: refused in one line)",
                  sandbox_masked)

        def no_compiler() -> dict[str, Any]:
            rc, out, log = run(root, ["/bin/sh", "-c", "for c in gcc cc g++ c++ cmake make; do command -v $c; done; "
                               "true"], env=env, user=user, workdir=workdir, name="no-compiler")
            found = [l for l in out.splitlines()[2:] if l.strip()]
            if found:
                raise StepFailed(f"compilers in the runtime root: {found}")
            return {"absent": ["gcc", "cc", "g++", "c++", "cmake", "make"]}
        self.step("runtime: no C/C++ compiler", no_compiler)

    def sizes(self) -> dict[str, int]:
        return {label: du_mb(root) for label, root in self.roots.items() if root.exists()}

    def report(self, outcome: str, error: str | None, sizes: dict[str, int]) -> dict[str, Any]:
        return {
            "outcome": outcome,
            "error": error,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": {"kernel": os.uname().release, "cpus": os.cpu_count(),
                     "load_at_end": [round(x, 2) for x in os.getloadavg()]},
            "base": "Debian bookworm (debootstrap --variant=minbase from deb.debian.org) with Debian's python3 "
                    "3.11 and python3-venv, standing for python:3.11-slim-bookworm",
            "total_seconds": round(sum(s.get("seconds", 0) for s in self.steps), 1),
            "steps": self.steps,
            "pip": {"wheels_from_cache": sorted(set(self.cached)), "wheels_built_here": sorted(set(self.built))},
            "root_sizes_mb": sizes,
            "results": self.results,
            "not_checked": NOT_CHECKED,
            "command": shlex.join(["python", "benchmarks/docker_steps.py", *sys.argv[1:]]),
        }

    def cleanup(self, failed: bool) -> str:
        left = mounts_under(self.work)
        for point in sorted(left, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False)
        left = mounts_under(self.work)
        if left:
            return f"NOT deleted: still mounted under it: {left}"
        if self.args.keep or (failed and self.args.keep_on_failure):
            return f"kept: {self.work}"
        subprocess.run(["rm", "-rf", "--one-file-system", str(self.work)], check=False)
        return "deleted" if not self.work.exists() else f"partly deleted: {self.work}"


class StepFailed(Exception):
    pass


def du_mb(path: Path) -> int:
    out = subprocess.run(["du", "-sxm", str(path)], capture_output=True, text=True).stdout
    return int(out.split()[0]) if out else -1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Runs inside the runtime root with the image's python: a prefect server, `nas serve` from /app, a
# deployment run of the table search to completion, then SIGTERM to `nas serve` (exit 0 expected).
SERVE_CHECK = r'''
import json, os, signal, subprocess, sys, time
from pathlib import Path
import httpx

port = sys.argv[1]
api = f"http://127.0.0.1:{port}/api"
tmp = Path("/tmp/docker-steps-serve"); tmp.mkdir(exist_ok=True)
server_env = {**os.environ, "PREFECT_HOME": str(tmp / "server-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
              "PREFECT_UI_ENABLED": "false"}
client = {**os.environ, "PREFECT_API_URL": api, "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
procs = []
def start(cmd, env, name):
    f = open(tmp / f"{name}.log", "w")
    p = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    procs.append(p)
    return p
def ok(path):
    try:
        return httpx.get(api + path, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
def wait(check, what, timeout, watched):
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        for p, name in watched:
            if p.poll() is not None:
                sys.exit(f"{name} exited {p.returncode} waiting for {what}: " + (tmp / f"{name}.log").read_text()[-2000:])
        if check():
            return round(time.monotonic() - t, 1)
        time.sleep(0.5)
    sys.exit(f"timed out waiting for {what}")
out = {}
try:
    t0 = time.monotonic()
    server = start(["prefect", "server", "start", "--host", "127.0.0.1", "--port", port], server_env, "server")
    out["server_healthy_s"] = wait(lambda: ok("/health"), "the server", 240, [(server, "server")])
    serve = start(["nas", "serve", "--limit", "1"], client, "serve")
    out["deployment_registered_s"] = wait(lambda: ok("/deployments/name/nas-search-overrides/table-search"),
                                          "the table-search deployment", 240, [(server, "server"), (serve, "serve")])
    overrides = ["space=nb201", "strategy=random", "evaluator=table", "budget.trials=5", "seed=7"]
    t = time.monotonic()
    run = subprocess.run(["prefect", "deployment", "run", "nas-search-overrides/table-search", "--param",
                          "overrides=" + json.dumps(overrides), "--watch", "--watch-interval", "1",
                          "--watch-timeout", "400"], env={**client, "PREFECT_HOME": str(tmp / "cli-home")},
                         capture_output=True, text=True, timeout=450)
    out["deployment_run_s"] = round(time.monotonic() - t, 1)
    if run.returncode != 0 or "Completed" not in run.stdout:
        sys.exit("deployment run: " + run.stdout[-1500:] + run.stderr[-1500:] + (tmp / "serve.log").read_text()[-2500:])
    dirs = sorted(Path("/app/runs").glob("random-nb201-s7*"), key=lambda p: p.stat().st_mtime)
    summary = json.loads((dirs[-1] / "summary.json").read_text())
    if summary.get("trials") != 5:
        sys.exit(f"summary trials {summary.get('trials')}")
    out["run_dir"] = str(dirs[-1])
    out["trials"] = summary["trials"]
    serve.send_signal(signal.SIGTERM)
    out["serve_exit"] = serve.wait(60)
    out["serve_last_line"] = (tmp / "serve.log").read_text().rstrip().splitlines()[-1]
    if out["serve_exit"] != 0:
        sys.exit("nas serve exit " + str(out["serve_exit"]) + ": " + (tmp / "serve.log").read_text()[-2000:])
    out["total_s"] = round(time.monotonic() - t0, 1)
finally:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(20)
            except Exception:
                os.killpg(p.pid, signal.SIGKILL)
print(json.dumps(out))
'''


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dockerfile", default=str(ROOT / "Dockerfile"))
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--work-dir", default="/var/tmp", help="where the temp dir of roots goes (~20 GB)")
    parser.add_argument("--pip-cache", default="~/.cache/pip", help="the host pip cache whose wheels/ is copied")
    parser.add_argument("--no-pip-cache", action="store_true", help="an empty type=cache mount (compiles llama.cpp)")
    parser.add_argument("--no-host-pip", action="store_true", help="do not bind the host's pip mirrors in")
    parser.add_argument("--no-serve", action="store_true", help="skip the prefect server + nas serve check")
    parser.add_argument("--keep", action="store_true", help="keep the roots (the logs are always kept)")
    parser.add_argument("--keep-on-failure", action="store_true", help="keep the roots if a step fails")
    parser.add_argument("--step-timeout", type=float, default=3600)
    parser.add_argument("--build-arg", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    args.build_arg = dict(a.partition("=")[::2] for a in args.build_arg)
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        print("docker_steps: needs root on Linux (debootstrap, mount namespaces, pivot_root)", file=sys.stderr)
        return 2
    from nas.io import atomic_write_json

    globals_, stages = parse_dockerfile(Path(args.dockerfile).read_text())
    global_args: dict[str, str] = {}
    for ins in globals_:
        for key, value in parse_assignments(ins.args, global_args).items():
            global_args[key] = args.build_arg.get(key, value)
    replay = Replay(args)
    outcome, error = "fail", None
    print(f"docker_steps: work dir {replay.work}", flush=True)
    try:
        replay.step("host: debootstrap installed", replay.ensure_debootstrap)
        replay.step(f"host: debootstrap --variant=minbase {SUITE}", replay.debootstrap)
        replay.step("base: Debian's python3 3.11 + python3-venv (for python:3.11-slim-bookworm)", replay.base_image)
        replay.step("host: pip cache and mirrors for the RUN steps", replay.setup_pip,
                    cached="see detail")
        for stage in stages:
            replay.run_stage(stage, global_args)
        replay.checks(stages[-1].name or str(stages[-1].index))
        outcome = "pass"
    except StepFailed as exc:
        error = str(exc)[-3000:]
    except KeyboardInterrupt:
        error = "interrupted"
    finally:
        sizes = replay.sizes()
        cleanup = replay.cleanup(outcome != "pass")
        print(f"docker_steps: work dir {cleanup}", flush=True)
        report = replay.report(outcome, error, sizes)
        report["cleanup"] = cleanup
        report["logs"] = str(replay.logs)
        atomic_write_json(Path(args.out), report)
        print(f"docker_steps: {outcome} in {report['total_seconds']} s -> {args.out}", flush=True)
    return 0 if outcome == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
