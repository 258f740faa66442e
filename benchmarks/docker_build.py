"""The Docker image, built: buildah builds the Dockerfile as written from a debootstrapped Debian
bookworm imported as its base image (PYTHON_IMAGE), then podman runs the image: its default command,
`nas arch validate` on a hostile model, `nas serve` with a Prefect server.

    sudo python benchmarks/docker_build.py            # ~40-60 min on 2 busy cores; root, Linux, network
                                                      # to deb.debian.org and PyPI (or the host's mirrors)
    python benchmarks/docker_build.py --keep          # keep the images (a rerun reuses base and layers)

Steps (each timed, in benchmarks/results/docker_build.json):
  1. `apt-get install buildah podman runc` if missing; their versions;
  2. the base image, localhost/nasflow-base:bookworm: `debootstrap --variant=minbase bookworm` (.debs kept
     in /var/cache/nasflow-debootstrap), `podman import`ed, then Debian's python3 3.11, python3-venv,
     ca-certificates, netbase, tzdata installed in `buildah run --isolation chroot` and committed with
     python:3.11-slim's PATH, LANG and CMD (Docker Hub, and so python:3.11-slim itself, is not reachable here);
  3. `buildah build --isolation chroot --layers --build-arg PYTHON_IMAGE=localhost/nasflow-base:bookworm
     -f Dockerfile -t localhost/nasflow:test .`, in containers-storage of its own (/var/lib/nasflow-docker-build,
     overlay driver; --storage-driver vfs), every STEP timed from buildah's output;
  4. the image's size, layers and config (`podman image inspect`);
  5. `podman run` of the image (crun as it comes; where crun cannot run here, runc with cgroupfs and
     rlimits no higher than the host's; where podman cannot at all, `buildah run --isolation chroot`):
     the default command (ENTRYPOINT + CMD, the NB201 table search) with /app/runs on a host dir owned by
     uid 1000; `nas arch validate` on tests/hostile/escape_ctypes_system.py with podman's default masked
     /proc (expected: refused in one line), then with `--security-opt unmask=ALL --security-opt
     seccomp=unconfined` (podman's spelling of Docker's systempaths=unconfined; bubblewrap runs and the model
     is contained: its canary dir stays empty); `nas serve --limit 1` with a `prefect server` in the
     container and a deployment run of the table search to completion; no C/C++ compiler and no
     __pycache__ from the build context in the image;
  6. unless --keep: the containers, images and the storage dir removed.

pip: the Dockerfile's `RUN --mount=type=cache` is buildah's own cache dir (empty on a first build, so
llama.cpp compiles; the host's ~/.cache/pip is not used); by default the host's pip mirrors (pip config's
find-links/extra-index-url file:// dirs, and its CA bundle) are bind-mounted read-only into every RUN
(`buildah build -v`, in no layer) with a pip.conf whose index settings are in its [wheel] section only:
the build stage's `pip wheel` sees them, the runtime's `pip install --no-index` only /wheels.
`--no-host-pip`: PyPI alone.
"""

from __future__ import annotations

import argparse
import configparser
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
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
OUT = ROOT / "benchmarks" / "results" / "docker_build.json"
STORAGE = Path("/var/lib/nasflow-docker-build")
RUNROOT = Path("/run/nasflow-docker-build")
BUILDAH_CACHE = Path(os.environ.get("TMPDIR", "/var/tmp")) / "buildah-cache"  # RUN --mount=type=cache dirs
BASE_TAG = "localhost/nasflow-base:bookworm"
IMAGE_TAG = "localhost/nasflow:test"
DEBOOTSTRAP_TAG = "localhost/nasflow-debootstrap:bookworm"  # the bare root, removed once the base is made
HOSTILE = ROOT / "tests" / "hostile" / "escape_ctypes_system.py"
MIRROR = "http://deb.debian.org/debian"
DEB_CACHE = Path("/var/cache/nasflow-debootstrap")
SUITE = "bookworm"
SOURCES = (f"deb {MIRROR} {SUITE} main\ndeb {MIRROR} {SUITE}-updates main\n"
           f"deb http://deb.debian.org/debian-security {SUITE}-security main\n")
# What python:3.11-slim-bookworm adds to debian:bookworm-slim, as Debian packages, and what its config sets
# (PATH, LANG; GPG_KEY and PYTHON_VERSION are its own build's).
BASE_PACKAGES = ["python3", "python3-venv", "ca-certificates", "netbase", "tzdata"]
BASE_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"]
COMPILERS = ["gcc", "cc", "g++", "c++", "cmake", "make"]
# An honest model, validated where bubblewrap runs: the sandbox works in the image (not only refuses).
HONEST = """import torch
from torch import nn


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                      nn.Flatten())
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))
"""


def podman_configs(nofile_soft: int, nofile_hard: int) -> list[tuple[str, list[str], list[str]]]:
    """The ways `podman run` is tried, in order: as it comes, then (this sandbox: crun refuses cgroups v1+v2
    "hybrid mode" and raising RLIMIT_NOFILE/NPROC) runc with cgroupfs and rlimits no higher than the host's."""
    return [("podman's defaults (crun)", [], []),
            ("runc, --cgroup-manager cgroupfs, --ulimit nofile/nproc no higher than the host's",
             ["--runtime", "runc", "--cgroup-manager", "cgroupfs"],
             ["--ulimit", f"nofile={nofile_soft}:{nofile_hard}", "--ulimit", "nproc=4096:4096"])]


# ---------------------------------------------------------------------------------------------
# Parsing buildah's output and podman's answers (unit-tested in tests/test_docker_build.py)

_STEP = re.compile(r"^(?:\[(\d+)/(\d+)\] )?STEP (\d+)/(\d+): (.*)$")


def parse_build_log(lines: list[tuple[float, str]], end: float | None = None) -> list[dict[str, Any]]:
    """(seconds since the build started, line) of `buildah build` -> its STEPs: stage, step, the
    instruction, wall seconds (to the next STEP, or `end`) and whether buildah took it from its cache."""
    steps: list[dict[str, Any]] = []
    for t, line in lines:
        m = _STEP.match(line.strip())
        if m:
            if steps:
                steps[-1]["seconds"] = round(t - steps[-1].pop("_start"), 1)
            steps.append({"stage": int(m.group(1) or 1), "step": f"{m.group(3)}/{m.group(4)}",
                          "instruction": m.group(5)[:160], "cached": False, "_start": t})
        elif steps and line.strip().startswith("--> Using cache"):
            steps[-1]["cached"] = True
    if steps:
        last = end if end is not None else (lines[-1][0] if lines else steps[-1]["_start"])
        steps[-1]["seconds"] = round(last - steps[-1].pop("_start"), 1)
    return steps


def pip_summary(text: str) -> dict[str, Any]:
    """What pip said in the build's output: wheels built here, files downloaded, files taken from the
    host's mirrors (Processing /opt/... or file:// links), cached downloads."""
    built = sorted(set(re.findall(r"Building wheel for (\S+) ", text)))
    return {"built_here": built,
            "downloaded": len(re.findall(r"^\s*Downloading \S", text, re.M)),
            "from_host_mirrors": len(re.findall(r"^\s*Processing (?:file://)?/opt/", text, re.M)),
            "from_pip_cache": len(re.findall(r"^\s*Using cached \S", text, re.M))}


def host_pip_conf(config_list: str) -> tuple[str, list[str], str | None]:
    """`pip config list` of the host -> (a pip.conf for the build, the host dirs it names, the CA bundle):
    index settings in [wheel] only (the build stage's `pip wheel`), the CA in [global]."""
    wheel: dict[str, str] = {}
    dirs: list[str] = []
    cert = None
    for line in config_list.splitlines():
        key, _, value = line.partition("=")
        option = key.rpartition(".")[2]
        value = value.strip().strip("'\"")
        if option == "cert" and value.startswith("/"):
            cert = value
        elif option in ("find-links", "extra-index-url", "index-url") and value:
            wheel[option] = value
            for item in value.split():
                path = item.removeprefix("file://")
                if path.startswith("/"):
                    parts = Path(path).parts
                    top = str(Path(*parts[:3]))  # /opt/pypi/simple -> /opt/pypi
                    if top not in dirs:
                        dirs.append(top)
    conf = configparser.ConfigParser()
    if cert:
        conf["global"] = {"cert": "/run/host-pip-ca.crt"}
    if wheel:
        conf["wheel"] = wheel
    text = ""
    for section in conf.sections():
        text += f"[{section}]\n" + "".join(f"{k} = {v}\n" for k, v in conf[section].items())
    return text, dirs, cert


def one_line(text: str, needle: str) -> str | None:
    return next((line.strip() for line in text.splitlines() if needle in line), None)


# ---------------------------------------------------------------------------------------------
# The build


class StepFailed(Exception):
    pass


def ensure_debootstrap() -> str:
    if shutil.which("debootstrap"):
        return "already installed"
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "debootstrap"], check=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return "installed with apt-get"


def debootstrap_root(base: Path, log: Path) -> str:
    """`debootstrap --variant=minbase bookworm` into `base` (.debs kept in DEB_CACHE): what was cached."""
    DEB_CACHE.mkdir(parents=True, exist_ok=True)
    before = len(list(DEB_CACHE.glob("*.deb")))
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
        raise StepFailed(f"debootstrap exit {rc}:\n{log.read_text(errors='replace')[-2500:]}")
    return (f"{before} .debs already in {DEB_CACHE} (a rerun downloads none)"
            if before else f"none: downloaded into {DEB_CACHE}")


class Build:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.steps: list[dict[str, Any]] = []
        self.results: dict[str, Any] = {}
        self.work = Path(tempfile.mkdtemp(prefix="nasflow-docker-build-", dir=args.work_dir))
        self.logs = self.work / "logs"
        self.logs.mkdir()
        self.t0 = time.monotonic()
        self.storage = Path(args.storage)
        self.flags = ["--root", str(self.storage / "storage"), "--runroot", str(RUNROOT),
                      "--storage-driver", args.storage_driver]
        self.podman_global: list[str] = []
        self.podman_opts: list[str] = []
        self.loads: list[float] = []
        self._sampling = True
        threading.Thread(target=self._sample_load, daemon=True).start()

    def _sample_load(self) -> None:
        while self._sampling:
            self.loads.append(os.getloadavg()[0])
            time.sleep(30)

    def step(self, name: str, fn) -> Any:
        print(f"[+{time.monotonic() - self.t0:7.1f} s] {name} ...", flush=True)
        start = time.monotonic()
        record: dict[str, Any] = {"step": name}
        self.steps.append(record)
        try:
            detail = fn()
            record["ok"] = True
            if detail is not None:
                record["detail"] = detail
            return detail
        except Exception as exc:
            record["ok"] = False
            record["detail"] = str(exc)[-3000:] if isinstance(exc, StepFailed) else f"{type(exc).__name__}: {exc}"
            raise StepFailed(record["detail"]) from exc
        finally:
            record["seconds"] = round(time.monotonic() - start, 1)
            print(f"    {'ok' if record.get('ok') else 'FAILED'} in {record['seconds']} s"
                  + ("" if record.get("ok") else f": {str(record.get('detail'))[-1500:]}"), flush=True)

    def engine(self, tool: str, *argv: str, timeout: float = 600, check: bool = True,
               input: bytes | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([tool, *self.flags, *argv], capture_output=True, timeout=timeout, input=input)
        out = subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(errors="replace"),
                                          proc.stderr.decode(errors="replace"))
        if check and proc.returncode != 0:
            raise StepFailed(f"{shlex.join([tool, *argv])[:300]}: exit {proc.returncode}\n"
                             f"{out.stdout[-1500:]}{out.stderr[-1500:]}")
        return out

    def exists(self, ref: str) -> bool:
        return self.engine("buildah", "inspect", "--type", "image", ref, check=False).returncode == 0

    # -- 1
    def ensure_engine(self) -> dict[str, Any]:
        installed = "already installed"
        if not all(shutil.which(tool) for tool in ("buildah", "podman", "runc")):
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            subprocess.run(["apt-get", "update", "-qq"], check=True)
            subprocess.run(["apt-get", "install", "-y", "-qq", "buildah", "podman", "runc"], check=True, env=env)
            installed = "installed with apt-get"
        versions = {tool: subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip()
                    for tool in ("buildah", "podman", "runc")}
        self.results["engine"] = versions["buildah"]
        return {"installed": installed, **versions, "storage_driver": self.args.storage_driver,
                "storage": str(self.storage)}

    # -- 2
    def base_image(self) -> dict[str, Any]:
        if self.exists(BASE_TAG) and not self.args.rebase:
            detail: dict[str, Any] = {"cached": f"{BASE_TAG} already in {self.storage} (--rebase rebuilds it)"}
        else:
            root = self.work / "base"
            detail = {"debootstrap": ensure_debootstrap()}
            detail["debootstrap_cache"] = debootstrap_root(root, self.logs / "debootstrap.log")
            (root / "etc/apt/sources.list").write_text(SOURCES)
            tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-cf", "-", "."],
                                   stdout=subprocess.PIPE)
            imp = subprocess.run(["podman", *self.flags, "import", "-", DEBOOTSTRAP_TAG], stdin=tar.stdout,
                                 capture_output=True, text=True, timeout=1200)
            tar.stdout.close()
            if tar.wait() != 0 or imp.returncode != 0:
                raise StepFailed(f"podman import: exit {imp.returncode}: {imp.stderr[-1500:]}")
            subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)
            ctr = self.engine("buildah", "from", "--pull=never", DEBOOTSTRAP_TAG).stdout.strip().splitlines()[-1]
            try:
                script = ("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                          "--no-install-recommends " + " ".join(BASE_PACKAGES)
                          + " >/dev/null && rm -rf /var/lib/apt/lists/* && python3 --version")
                out = self.engine("buildah", "run", "--isolation", "chroot", ctr, "--", "/bin/sh", "-c", script,
                                  timeout=1800).stdout
                detail["python"] = out.strip().splitlines()[-1]
                config = [*(a for e in BASE_ENV for a in ("--env", e)), "--cmd", "python3",
                          "--label", f"org.nasflow.base.python={detail['python']}",
                          "--label", "org.nasflow.base.root=debootstrap --variant=minbase bookworm"]
                self.engine("buildah", "config", *config, ctr)
                self.engine("buildah", "commit", "--rm", ctr, BASE_TAG, timeout=1200)
            except BaseException:
                self.engine("buildah", "rm", ctr, check=False)
                raise
            finally:
                self.engine("buildah", "rmi", DEBOOTSTRAP_TAG, check=False)
        info = json.loads(self.engine("podman", "image", "inspect", BASE_TAG).stdout)[0]
        labels = info["Config"].get("Labels") or {}
        detail.update({"image": BASE_TAG, "id": info["Id"][:12], "size_mb": round(info["Size"] / 1e6),
                       "config": {k: info["Config"].get(k) for k in ("Env", "Cmd", "Labels")}})
        detail.setdefault("python", labels.get("org.nasflow.base.python"))
        self.results["base_image"] = {
            "tag": BASE_TAG, "size_mb": detail["size_mb"], "python": detail["python"],
            "what": "debootstrap --variant=minbase bookworm (deb.debian.org), podman import; then in `buildah run "
                    "--isolation chroot` Debian's " + ", ".join(BASE_PACKAGES) + " (apt lists removed), buildah "
                    "commit with python:3.11-slim's PATH, LANG and CMD",
            "stands_for": "python:3.11-slim-bookworm (Docker Hub is not reachable here; its Python 3.11 is built in "
                          "/usr/local, this one is Debian's in /usr/bin; the Dockerfile uses python3 and a venv in "
                          "both stages, so either base runs the same steps)"}
        return detail

    # -- 3
    def pip_sources(self) -> list[str]:
        if self.args.no_host_pip:
            self.results["pip"] = {"host_mirrors": "off: PyPI only"}
            return []
        listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                                 text=True).stdout
        text, dirs, cert = host_pip_conf(listing)
        conf = self.work / "pip.conf"
        conf.write_text(text)
        volumes = [f"{conf}:/etc/pip.conf:ro", *(f"{d}:{d}:ro" for d in dirs if Path(d).exists())]
        if cert and Path(cert).is_file():
            volumes.append(f"{cert}:/run/host-pip-ca.crt:ro")
        self.results["pip"] = {"host_mirrors": dirs, "pip_conf": text,
                               "how": "buildah build -v (read-only, into every RUN; in no layer)"}
        return volumes

    def build(self) -> dict[str, Any]:
        volumes = self.pip_sources()
        if self.args.no_pip_cache and BUILDAH_CACHE.exists():
            shutil.rmtree(BUILDAH_CACHE)
        before = sorted(p.name for p in BUILDAH_CACHE.rglob("*.whl")) if BUILDAH_CACHE.exists() else []
        cache_note = (f"buildah's own RUN --mount=type=cache dir ({BUILDAH_CACHE}; the host's ~/.cache/pip is not "
                      f"used): {len(before)} built wheels in it before the build"
                      + (f" ({', '.join(before)})" if before else "") + (" (emptied: --no-pip-cache)"
                                                                        if self.args.no_pip_cache else ""))
        dockerfile = Path(self.args.dockerfile)
        argv = ["buildah", *self.flags, "build", "--isolation", "chroot", "--layers",
                "--build-arg", f"PYTHON_IMAGE={BASE_TAG}", *(f"--build-arg={a}" for a in self.args.build_arg),
                *(a for v in volumes for a in ("-v", v)), "-f", str(dockerfile), "-t", IMAGE_TAG, str(ROOT)]
        self.results["build_command"] = shlex.join(argv)
        log = self.logs / "build.log"
        lines: list[tuple[float, str]] = []
        start = time.monotonic()
        with log.open("w") as f:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    errors="replace", start_new_session=True, cwd=ROOT)
            timer = threading.Timer(self.args.build_timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
            timer.start()
            try:
                for line in proc.stdout:
                    t = time.monotonic() - start
                    lines.append((t, line.rstrip("\n")))
                    f.write(f"[{t:7.1f}] {line}")
                    f.flush()
                    if _STEP.match(line.strip()) or line.startswith(("COMMIT", "Successfully tagged")):
                        print(f"    [+{t:7.1f} s] {line.rstrip()[:150]}", flush=True)
                rc = proc.wait()
            except BaseException:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
            finally:
                timer.cancel()
        end = time.monotonic() - start
        steps = parse_build_log(lines, end)
        text = "\n".join(line for _, line in lines)
        self.results["build_steps"] = steps
        self.results["pip"] = {**self.results.get("pip", {}), **pip_summary(text),
                               "cache_mount": cache_note}
        self.results["build_seconds"] = round(end, 1)
        if rc != 0:
            raise StepFailed(f"buildah build exit {rc} ({log}):\n" + "\n".join(line for _, line in lines[-40:]))
        return {"seconds": round(end, 1), "steps": len(steps), "cached_steps": sum(s["cached"] for s in steps),
                "log": str(log)}

    # -- 4
    def inspect(self) -> dict[str, Any]:
        info = json.loads(self.engine("podman", "image", "inspect", IMAGE_TAG).stdout)[0]
        config = info.get("Config", {})
        self.results["image_size_mb"] = round(info["Size"] / 1e6)
        self.results["image"] = {
            "tag": IMAGE_TAG, "id": info["Id"][:12], "size_bytes": info["Size"],
            "layers": len(info.get("RootFS", {}).get("Layers", [])),
            "human_size": self.engine("buildah", "images", "--format", "{{.Size}}", IMAGE_TAG).stdout.strip(),
            **{k.lower(): config.get(k) for k in ("User", "WorkingDir", "Entrypoint", "Cmd", "Volumes", "Env")}}
        return {k: self.results["image"][k] for k in ("id", "layers", "human_size", "entrypoint", "cmd", "user")}

    # -- 5
    def choose_runner(self) -> dict[str, Any]:
        """`podman run` as it comes (crun), else with what this sandbox allows, else `buildah run`."""
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        tries: dict[str, str] = {}
        for label, global_flags, opts in podman_configs(soft, hard):
            self.podman_global, self.podman_opts = list(global_flags), list(opts)
            rc, out = self.podman_run(["--help"], name=f"probe-{len(tries)}", timeout=300)
            if rc == 0 and "nas search" in out:
                self.runner = "podman"
                tries[label] = "ok: nas --help"
                self.results["runner"] = {"engine": "podman run", "flags": [*global_flags, *opts], "tries": tries}
                return self.results["runner"]
            tries[label] = f"exit {rc}: {one_line(out, 'Error') or out.strip()[-300:]}"
        self.runner = "buildah"
        self.container = self.engine("buildah", "from", "--pull=never", IMAGE_TAG).stdout.strip().splitlines()[-1]
        self.results["runner"] = {"engine": "buildah run --isolation chroot (podman run failed here)", "tries": tries}
        return self.results["runner"]

    def podman_run(self, args: list[str], *, opts: tuple[str, ...] = (), name: str,
                   timeout: float = 1800) -> tuple[int, str]:
        log = self.logs / f"run-{name}.log"
        argv = ["podman", *self.flags, *self.podman_global, "run", "--rm", "--pull=never", *self.podman_opts, *opts,
                IMAGE_TAG, *args]
        try:
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
            rc, out = proc.returncode, proc.stdout.decode(errors="replace")
        except subprocess.TimeoutExpired as exc:
            rc, out = 124, (exc.stdout or b"").decode(errors="replace")
        log.write_text(f"$ {shlex.join(argv)}\n{out}")
        return rc, out

    def run_image(self, args: list[str] | None, *, volumes: tuple[str, ...] = (), opts: tuple[str, ...] = (),
                  env: dict[str, str] | None = None, name: str, entrypoint: str | None = None) -> tuple[int, str]:
        """The image run as `podman run` would (ENTRYPOINT + CMD when `args` is None)."""
        env = env or {}
        if self.runner == "podman":
            flags = (*opts, *(a for v in volumes for a in ("-v", v)), *(a for k, v in env.items()
                                                                       for a in ("-e", f"{k}={v}")))
            if entrypoint:
                flags = ("--entrypoint", entrypoint, *flags)
            return self.podman_run(args or [], opts=flags, name=name)
        image = self.results["image"]
        head = [entrypoint] if entrypoint else list(image["entrypoint"] or [])
        argv = head + (args if args is not None else list(image["cmd"] or []))
        flags = [*(a for v in volumes for a in ("-v", v)), *(a for k, v in env.items() for a in ("--env", f"{k}={v}"))]
        proc = self.engine("buildah", "run", "--isolation", "chroot", *flags, self.container, "--", *argv,
                           timeout=1800, check=False)
        out = proc.stdout + proc.stderr
        (self.logs / f"run-{name}.log").write_text(f"$ {shlex.join(argv)}\n{out}")
        return proc.returncode, out

    def default_command(self) -> dict[str, Any]:
        runs = self.work / "runs"
        runs.mkdir()
        os.chown(runs, 1000, 1000)  # the image's user, nasflow (uid 1000)
        rc, out = self.run_image(None, volumes=(f"{runs}:/app/runs",), name="default-command")
        last = [line for line in out.splitlines() if line.strip()][-8:]
        self.results["default_command_exit"] = rc
        self.results["default_command"] = {
            "argv": (self.results["image"]["entrypoint"] or []) + (self.results["image"]["cmd"] or []),
            "exit": rc, "last_lines": last, "runs_mount": "a host dir owned by uid 1000 on /app/runs"}
        dirs = [d for d in runs.iterdir() if (d / "summary.json").exists()]
        if rc != 0:
            raise StepFailed(f"exit {rc}: {out[-2000:]}")
        if len(dirs) != 1:
            raise StepFailed(f"expected one run dir with summary.json in /app/runs, got {sorted(runs.iterdir())}")
        summary = json.loads((dirs[0] / "summary.json").read_text())
        self.results["default_command"].update({
            "run_dir": f"/app/runs/{dirs[0].name}", "trials": summary.get("trials"),
            "best": {k: summary[k] for k in ("best_accuracy", "best_key", "best") if k in summary},
            "run_dir_uid": dirs[0].stat().st_uid})
        return {"exit": rc, "trials": summary.get("trials"), "last_line": last[-1] if last else ""}

    def hostile(self) -> dict[str, Any]:
        canary = self.work / "canary"
        canary.mkdir()
        os.chown(canary, 1000, 1000)
        marker = "nasflow-docker-build-canary"
        model = self.work / HOSTILE.name
        model.write_text(HOSTILE.read_text().replace("__CANARY_DIR__", "/canary").replace("__MARKER__", marker))
        volumes = (f"{model}:/tmp/model/{HOSTILE.name}:ro", f"{canary}:/canary")
        argv = ["arch", "validate", f"/tmp/model/{HOSTILE.name}"]
        out: dict[str, Any] = {"model": str(HOSTILE.relative_to(ROOT)), "argv": ["nas", *argv],
                               "placeholders": {"__CANARY_DIR__": "/canary (a host dir, uid 1000)",
                                                "__MARKER__": marker}}
        cases = [("default", (), {}, "podman's defaults (masked /proc, its seccomp profile)"),
                 ("unmasked", ("--security-opt", "unmask=ALL", "--security-opt", "seccomp=unconfined"), {},
                  "--security-opt unmask=ALL --security-opt seccomp=unconfined (Docker: systempaths=unconfined, "
                  "seccomp=unconfined)")]
        if self.runner != "podman":
            cases = [("buildah-chroot", (), {}, "buildah run --isolation chroot")]
        for label, opts, env, what in cases:
            rc, text = self.run_image(argv, volumes=volumes, opts=opts, env=env, name=f"validate-{label}")
            lines = [line for line in text.splitlines() if line.strip()]
            refused = one_line(text, "OS isolation is unavailable")
            out[label] = {"as": what, "exit": rc, "lines": lines[-6:], "refused_line": refused,
                          "canary_touched": sorted(p.name for p in canary.iterdir())}
        if self.runner == "podman":  # where bubblewrap runs: an honest model passes the same sandbox
            honest = self.work / "honest.py"
            honest.write_text(HONEST)
            rc, text = self.run_image(["arch", "validate", "/tmp/model/honest.py"], opts=cases[1][1],
                                      volumes=(f"{honest}:/tmp/model/honest.py:ro",), name="validate-honest")
            lines = [line for line in text.splitlines() if line.strip()]
            out["honest_unmasked"] = {"as": cases[1][3], "exit": rc, "lines": lines[-3:]}
        self.results["hostile_validate"] = out
        touched = [c for c in out if isinstance(out[c], dict) and out[c].get("canary_touched")]
        if touched:
            raise StepFailed(f"the hostile model wrote the canary dir: {touched}")
        honest = out.get("honest_unmasked")
        if honest and (honest["exit"] != 0 or not any("valid model" in line for line in honest["lines"])):
            raise StepFailed(f"an honest model did not validate where bubblewrap runs: {honest['lines']}")
        first = out[cases[0][0]]
        if first["exit"] == 0 and not first["refused_line"]:
            raise StepFailed(f"expected a refusal or a failed validation: {first['lines']}")
        return {label: {"exit": out[label]["exit"], "line": (out[label]["refused_line"] or
                                                             (out[label]["lines"] or [""])[-1])[:300]}
                for label, *_ in cases}

    def serve(self) -> dict[str, Any]:
        checks = self.work / "checks"
        checks.mkdir(exist_ok=True)
        (checks / "serve_check.py").write_text(SERVE_CHECK)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        rc, out = self.run_image([ "/run/docker-build/serve_check.py", str(port)], entrypoint="python3",
                                 volumes=(f"{checks}:/run/docker-build:ro",), name="serve")
        if rc != 0:
            raise StepFailed(f"exit {rc}: {out[-2500:]}")
        self.results["serve"] = json.loads(out.strip().splitlines()[-1])
        return self.results["serve"]

    def no_compiler(self) -> dict[str, Any]:
        script = ("for c in " + " ".join(COMPILERS) + "; do command -v $c || true; done; "
                  "find /app -name __pycache__ -o -name '*.pyc' | sed 's/^/context: /'")
        rc, out = self.run_image(["-c", script], entrypoint="/bin/sh", name="no-compiler")
        found = [line for line in out.splitlines() if line.strip().startswith("/")]
        context = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("context: ")]
        self.results["no_compiler"] = {"checked": COMPILERS, "found": found, "pycache_in_app": context[:20]}
        if rc != 0 or found or context:
            raise StepFailed(f"exit {rc}; compilers in the image: {found}; .pyc from the context: {context[:5]}")
        return {"absent": COMPILERS, "pycache_in_app": "none"}

    # -- 6
    def cleanup(self) -> str:
        if getattr(self, "container", None):
            self.engine("buildah", "rm", self.container, check=False)
        if self.args.keep:
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.work / "base")], check=False)
            return f"kept: {IMAGE_TAG} and {BASE_TAG} in {self.storage} (--keep)"
        self.engine("podman", "rm", "--all", "--force", check=False)
        self.engine("buildah", "rm", "--all", check=False)
        self.engine("buildah", "rmi", "--all", "--force", check=False, timeout=1800)
        prefix = str(self.storage.resolve())
        left = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                if line.split()[4].startswith(prefix)]
        if left:
            return f"images removed; storage dir NOT deleted, still mounted: {left[:5]}"
        subprocess.run(["rm", "-rf", "--one-file-system", str(self.storage), str(BUILDAH_CACHE), str(RUNROOT)],
                       check=False)
        return f"containers, images, storage and {BUILDAH_CACHE} removed"

    def report(self, outcome: str, error: str | None) -> dict[str, Any]:
        import hashlib

        dockerfile = Path(self.args.dockerfile)
        self._sampling = False
        return {
            "outcome": outcome,
            "error": error,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "engine": self.results.get("engine"),
            "dockerfile": str(dockerfile.relative_to(ROOT)) if dockerfile.is_relative_to(ROOT) else str(dockerfile),
            "dockerfile_sha256": hashlib.sha256(dockerfile.read_bytes()).hexdigest(),
            "image_size_mb": self.results.get("image_size_mb"),
            "default_command_exit": self.results.get("default_command_exit"),
            "host": {"kernel": os.uname().release, "cpus": os.cpu_count(),
                     "load_1min": {"at_end": round(os.getloadavg()[0], 2),
                                   "mean": round(sum(self.loads) / len(self.loads), 2) if self.loads else None,
                                   "max": round(max(self.loads), 2) if self.loads else None,
                                   "samples": len(self.loads), "every_s": 30}},
            "total_seconds": round(time.monotonic() - self.t0, 1),
            "steps": self.steps,
            **{k: v for k, v in self.results.items() if k not in ("engine", "image_size_mb", "default_command_exit")},
            "command": shlex.join(["python", "benchmarks/docker_build.py", *sys.argv[1:]]),
        }


# Runs in the image (its python, as its user, in /app): a prefect server, `nas serve` from /app, a
# deployment run of the table search to completion, then SIGTERM to `nas serve` (exit 0 expected).
SERVE_CHECK = r'''
import json, os, signal, subprocess, sys, time
from pathlib import Path
import httpx

port = sys.argv[1]
api = f"http://127.0.0.1:{port}/api"
tmp = Path("/tmp/docker-build-serve"); tmp.mkdir(exist_ok=True)
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
    parser.add_argument("--work-dir", default="/var/tmp", help="temp dir: the debootstrapped root, logs, run dirs")
    parser.add_argument("--storage", default=str(STORAGE), help="containers-storage of this script's own")
    parser.add_argument("--storage-driver", default="overlay", choices=["overlay", "vfs"])
    parser.add_argument("--no-host-pip", action="store_true", help="do not bind the host's pip mirrors in")
    parser.add_argument("--no-pip-cache", action="store_true",
                        help="empty buildah's type=cache dir first (llama.cpp compiles again)")
    parser.add_argument("--rebase", action="store_true", help="rebuild the base image even if it is there")
    parser.add_argument("--keep", action="store_true", help="keep the images and storage (a rerun reuses them)")
    parser.add_argument("--build-timeout", type=float, default=3 * 3600)
    parser.add_argument("--build-arg", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        print("docker_build: needs root on Linux (debootstrap, buildah with chroot isolation)", file=sys.stderr)
        return 2
    from nas.io import atomic_write_json

    build = Build(args)
    outcome, error = "fail", None
    print(f"docker_build: work dir {build.work}", flush=True)
    try:
        build.step("host: buildah and podman", build.ensure_engine)
        build.step(f"base image {BASE_TAG}: debootstrap bookworm + python3, podman import", build.base_image)
        build.step(f"buildah build --isolation chroot --layers -t {IMAGE_TAG} (the Dockerfile as written)",
                   build.build)
        build.step("image: size, layers, config", build.inspect)
        build.step("run: podman run, or buildah run if podman cannot", build.choose_runner)
        build.step("run: the default command (ENTRYPOINT + CMD)", build.default_command)
        build.step(f"run: nas arch validate {HOSTILE.relative_to(ROOT)}", build.hostile)
        build.step("run: nas serve with a prefect server; a deployment run of the table search", build.serve)
        build.step("run: no C/C++ compiler, no __pycache__ from the build context in /app", build.no_compiler)
        outcome = "pass"
    except StepFailed as exc:
        error = str(exc)[-3000:]
    except KeyboardInterrupt:
        error = "interrupted"
    finally:
        try:
            cleanup = build.cleanup()
        except Exception as exc:  # the report is written whatever cleanup does
            cleanup = f"cleanup failed: {type(exc).__name__}: {exc}"
        print(f"docker_build: {cleanup}", flush=True)
        report = build.report(outcome, error)
        report["cleanup"] = cleanup
        report["logs"] = str(build.logs)
        atomic_write_json(Path(args.out), report)
        print(f"docker_build: {outcome} in {report['total_seconds']} s -> {args.out}", flush=True)
    return 0 if outcome == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
