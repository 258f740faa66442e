"""The observer's side of the hostile-model suite (tests/test_hostile.py): the
hostile templates' headers, the canary listeners, the /proc scan and the
file-system snapshots that say whether anything got out of the sandbox.

Everything here is trusted test code: it never imports or runs a hostile file,
it only reads their header comments and substitutes their placeholders.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import selectors
import socket
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

HOSTILE = Path(__file__).parent / "hostile"
KINDS = ("escape", "secret", "data", "forge", "network", "process", "cache", "fs", "dos", "parent")
CLIS = ("validate", "train")
EXPECTS = ("any", "invalid", "limits")
PLACEHOLDERS = ("__CANARY_DIR__", "__CANARY_PORT__", "__CANARY_SOCK__", "__NASFLOW_HOME__",
                "__RUN_DIR__", "__HOME__", "__MARKER__")
# The accuracy training forges claim (they claim 1 param and 1 FLOP too): never a trusted result.
FORGED_ACCURACY = 99.8765
_HEADER = re.compile(r"#\s*(attack|kind|cli|expect|wall_s|cpu_s):\s*(.+)")


@dataclass(frozen=True)
class Hostile:
    """One hostile template and what its header says about it. `cli`: which
    command runs it (train for training forges and resource abuse, which gets
    tight sandbox limits there); `expect`: `invalid` = the CLI must reject it,
    `limits` = reject it as a limits failure, `any` = only containment counts; `wall_s` and
    `cpu_s`: the sandbox's wall-clock and CPU-time limits for a `train` case, if not the suite's
    (a case that only waits for a limit to hit needs no more than the clean model's work)."""

    path: Path
    attack: str
    kind: str
    cli: str = "validate"
    expect: str = "any"
    wall_s: int | None = None
    cpu_s: int | None = None

    @property
    def stem(self) -> str:
        return self.path.stem

    @classmethod
    def load(cls, path: Path) -> "Hostile":
        fields = {}
        for line in path.read_text(encoding="utf-8").splitlines()[:6]:
            match = _HEADER.fullmatch(line.strip())
            if match:
                fields[match.group(1)] = match.group(2).strip()
        missing = {"attack", "kind"} - set(fields)
        if missing:
            raise ValueError(f"{path.name}: header lacks {', '.join(sorted(missing))}")
        limits = {name: int(fields.pop(name)) for name in ("wall_s", "cpu_s") if name in fields}
        return cls(path=path, **limits, **fields)

    def render(self, subs: dict[str, str]) -> str:
        text = self.path.read_text(encoding="utf-8")
        for key, value in subs.items():
            text = text.replace(key, value)
        return text


def hostile_files() -> list[Hostile]:
    return [Hostile.load(p) for p in sorted(HOSTILE.glob("*.py"))]


# --- the network every hostile file ships (trusted copy, for the true counts) ---

BASE_LINES = """\
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)
"""


class BaseNetwork(nn.Module):
    """The conv net of every hostile file without its attack: what an honest
    sandbox measures, whatever the attack claims."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


# --- canary listeners ------------------------------------------------------

@dataclass
class Canary:
    """Listeners an escaped attack would reach: TCP and UDP on 127.0.0.1:`port`,
    a unix stream socket at `sock`, a unix datagram socket at `sock`.dgram and
    an abstract unix stream socket named "\\0" + `sock`. Counts every
    connection or datagram (with its first bytes) until `close()`."""

    root: Path
    port: int = 0
    events: list[tuple[str, bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = str(self.root / "canary.sock")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._sockets: list[socket.socket] = []
        tcp = self._tcp_udp()
        self._listen(tcp, "tcp", stream=True)
        self._listen(self._udp, "udp", stream=False)
        for family_addr, kind, stream in ((self.sock, "unix", True), (self.sock + ".dgram", "unix-dgram", False),
                                          ("\0" + self.sock, "abstract", True)):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM if stream else socket.SOCK_DGRAM)
            s.bind(family_addr)
            self._listen(s, kind, stream)
        for path in (self.sock, self.sock + ".dgram"):
            os.chmod(path, 0o777)
        self._thread = threading.Thread(target=self._serve, name="canary", daemon=True)
        self._thread.start()

    def _tcp_udp(self) -> socket.socket:
        """A TCP and a UDP socket on the same free port."""
        for _ in range(50):
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            tcp.bind(("127.0.0.1", 0))
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                udp.bind(("127.0.0.1", tcp.getsockname()[1]))
            except OSError:
                tcp.close()
                udp.close()
                continue
            self.port, self._udp = tcp.getsockname()[1], udp
            return tcp
        raise RuntimeError("no free port for both TCP and UDP")

    def _listen(self, s: socket.socket, kind: str, stream: bool) -> None:
        if stream:
            s.listen(64)
        s.setblocking(False)
        self._sockets.append(s)
        self._sel.register(s, selectors.EVENT_READ, (kind, stream))

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(0.1):
                kind, stream = key.data
                try:
                    if stream:
                        conn, _ = key.fileobj.accept()
                        with conn:
                            conn.settimeout(0.2)
                            try:
                                data = conn.recv(4096)
                            except OSError:
                                data = b""
                    else:
                        data = key.fileobj.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                with self._lock:
                    self.events.append((kind, data[:200]))

    def count(self) -> int:
        with self._lock:
            return len(self.events)

    def since(self, start: int) -> list[tuple[str, bytes]]:
        with self._lock:
            return list(self.events[start:])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for s in self._sockets:
            s.close()
        self._sel.close()


# --- /proc ---------------------------------------------------------------

def marked_processes(needles: list[str], exclude: set[int] = frozenset()) -> dict[int, str]:
    """pid -> a description, for every process whose cmdline, environ or comm
    holds one of `needles` (other than this process and `exclude`)."""
    raw = [n.encode() for n in needles]
    found: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in exclude or int(entry.name) == os.getpid():
            continue
        for part in ("cmdline", "environ", "comm"):
            try:
                data = Path("/proc", entry.name, part).read_bytes()
            except OSError:  # exited meanwhile, or not ours to read
                continue
            if any(n in data for n in raw):
                found[int(entry.name)] = f"pid {entry.name} ({part}): {_cmdline(int(entry.name))}"
                break
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (field 22 of stat): tells a pid
    from a later process that reuses it; None once it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def descendants(root: int) -> dict[int, int | None]:
    """pid -> start time, for every live descendant of `root`."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                text = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            ppid = int(text[text.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out[child] = start_time(child)
            todo.append(child)
    return {pid: t for pid, t in out.items() if t is not None}


# --- files -----------------------------------------------------------------

def snapshot(root: Path) -> dict[str, tuple]:
    """relative path -> (type, mode, size, mtime_ns, sha256) for everything under `root`."""
    out: dict[str, tuple] = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            digest = _sha256(path) if stat.S_ISREG(st.st_mode) else None
            out[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size,
                                                st.st_mtime_ns, digest)
    return out


def _sha256(path: Path) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError:
        return None


def changes(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """What was added, removed or changed between two snapshots."""
    out = [f"new {p}" for p in sorted(set(after) - set(before))]
    out += [f"removed {p}" for p in sorted(set(before) - set(after))]
    out += [f"changed {p}" for p in sorted(set(before) & set(after)) if before[p] != after[p]]
    return out


def secret_forms(secret: str) -> list[str]:
    """The secret as an attacker may smuggle it out: raw, hex, base64, reversed."""
    return [secret, secret.encode().hex(), base64.b64encode(secret.encode()).decode(), secret[::-1]]


def files_holding(root: Path, needles: list[str], skip: set[Path]) -> list[str]:
    """Files under `root` (but not `skip`) whose bytes contain one of `needles`."""
    raw = [n.encode() for n in needles]
    hits = []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath, name)
            if path in skip or not path.is_file() or path.is_symlink():
                continue
            try:
                with open(path, "rb") as fh:
                    data = fh.read(64 << 20)
            except OSError:
                continue
            hits += [f"{path} holds {n.decode()[:12]}..." for n in raw if n in data]
    return hits


def named_outside(marker: str, roots: list[tuple[Path, bool]]) -> list[Path]:
    """Paths whose name holds `marker` under each (root, recursive)."""
    found = []
    for root, recursive in roots:
        if not root.is_dir():
            continue
        if recursive:
            for dirpath, dirnames, filenames in os.walk(root):
                found += [Path(dirpath, n) for n in dirnames + filenames if marker in n]
        else:
            found += [Path(root, n) for n in os.listdir(root) if marker in n]
    return found
