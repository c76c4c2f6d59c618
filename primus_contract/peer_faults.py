"""A failed collective that names its peer: the job's output, read after an attempt, mapped onto the job's nodes.

A rank whose collective broke often says which peer it lost, in text that only reaches the job's output (NCCL
writes its warnings to stdout, torch's watchdog logs to stderr and then aborts the process, so no Python handler
sees them). Three real formats are read (the sources are cited beside each pattern):

- NCCL/RCCL warnings (`NCCL_DEBUG=WARN`, which the preflight sets where the job left NCCL_DEBUG unset): a transport
  error naming the peer as `HOST<PORT>`, HOST an IP address or a host name, after NCCL's `host:pid:tid [dev]`
  prefix, which names the writer's host;
- gloo (the CPU backend): `Connection closed by peer [IP]:PORT`, `Read error [IP]:PORT: ...`, after torch's
  `[rankN]:` prefix, which names the writer's rank;
- torch's desync report (`TORCH_NCCL_DESYNC_DEBUG=1`, not set by default: it writes to the rendezvous store on
  every collective): the ranks that never joined the collective, or that finished the one before and did not join
  it. Read only for the default process group (`[PG ID 0 ...]`): a subgroup's report counts ranks inside it.

`hosts` records (the preflight on every node: its node name, host names and IP addresses) and the job's node
names map a named host or address onto a node; `rank` records (the trainer's rank 0) map a named rank. `named`
decides which nodes the findings blame (see there). Standard library only: the job script runs it from `<run_dir>/code`.
"""
from __future__ import annotations

import os
import re
import socket
import threading

RESOLVE_S = 2.0  # the resolver's time in addresses()
MAX_READ = 16 << 20  # the last bytes of the attempt's output that are read
# NCCL's WARN prefix (src/debug.cc, ncclDebugLog: "[timestamp] host:pid:tid [cudaDev] file:line NCCL WARN ...")
NCCL_WRITER = re.compile(r"(?:^|\s|\])(?P<host>[A-Za-z0-9][A-Za-z0-9_-]*):\d+:\d+ \[\d+\] .*NCCL WARN ")
# The WARNs that name the peer of a transport connection (NVIDIA/nccl, the same text in ROCm/rccl): net_ib
# "NET/IB : Got completion from peer %s with error %d, ..." (2.18), "NET/IB: Got completion from peer %s with
# status=..." (2.21+), misc/socket.cc "socketProgress: Connection closed by remote peer %s", os/linux.cc "%s:
# connect to %s failed : %s", "Call to recv from %s failed : %s", net_socket.cc "NET/Socket : peer %s message
# truncated ...", net_ib "... tag %x peer %s posted incorrect receive info ..."; %s is ncclSocketToString's
# "HOST<PORT>" (a numeric address, or the name getnameinfo found for it).
NCCL_PEER = re.compile(r"(?:from peer|remote peer|connect to|Connect to|recv from|send to|tag \w+ peer"
                       r"|NET/Socket : peer) (?P<peer>[^\s<>]+)<\d+>")
# gloo/transport/tcp/pair.cc: GLOO_ERROR_MSG("Connection closed by peer ", peer_.str()) and "Read error ", ...;
# torch 2.13 prints it as `[rank0]: RuntimeError: [.../gloo/transport/tcp/pair.cc:553] Connection closed by peer
# [127.0.0.1]:31432. This is typically caused by a remote worker crashing. ...`
GLOO_PEER = re.compile(r"(?:Connection closed by peer|Read error|Write error) \[(?P<peer>[^\]]+)\]:\d+")
TORCH_WRITER = re.compile(r"\[rank(?P<rank>\d+)\]:")  # torch's prefix (c10 logging, the Python excepthook): global
# ProcessGroupNCCL.cpp: c10::str(logPrefix(), "Watchdog caught collective operation timeout: ", work, " ran for ", ms,
# " milliseconds before timing out."): the writer waited (then its watchdog aborts the process, so no Python
# handler records it); `waits` turns these into the `timeout` lines the hang guess reads
WATCHDOG = re.compile(r"Watchdog caught collective operation timeout")
KEYWORDS = ("NCCL WARN", "by peer", "error [", "[PG ", "Timeout at collective", "collective #", "lagging ranks",
            "Watchdog caught")  # a line with none of these says nothing here (the output can be large)
# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp: LOG(ERROR) << logPrefix() << desyncMsg, logPrefix() being
# "[PG ID %d PG GUID %s(%s) Rank %d] " (older: "[PG %s Rank %d] "); TraceUtils.h's retrieveDesyncReport then
# writes "\n\t - [R] Timeout at collective: COL, #SEQ" and analyzeMissingRanks / analyzeLaggingRanks.
PG_PREFIX = re.compile(r"\[PG (?:ID )?(?P<pg>\S+?)(?: PG GUID \S+?)?(?:\((?P<desc>[^)]*)\))? Rank \d+\]")
DESYNC_SELF = re.compile(r"\[(?P<rank>\d+)\] Timeout at collective: (?P<col>[^,]+), #(?P<seq>\d+)")
DESYNC_MISSING = re.compile(r"ranks \[(?P<ranks>[\d, ]+)\] are the lagging ranks that caused this timeout")
DESYNC_BEHIND = re.compile(r"\[(?P<ranks>[\d, ]+)\] finished collective #(?P<seq>\d+), but didn't join collective")
DESYNC_STUCK = re.compile(r"\[(?P<ranks>[\d, ]+)\] joined but didn't finish collective #(?P<seq>\d+)")


def _ranks(text: str) -> list[int]:
    return [int(x) for x in text.replace(" ", "").split(",") if x.isdigit()]


def parse(text: str) -> list[dict]:
    """The findings in the text: {writer_host | writer_rank, peer | ranks, via, line}, in order."""
    out: list[dict] = []
    pg_default = None  # the last PG prefix seen: the default group's (its ranks are the job's ranks)?
    self_rank = self_seq = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or not any(k in line for k in KEYWORDS):
            continue
        excerpt = line[:240]
        writer = TORCH_WRITER.search(line)
        w_rank = int(writer["rank"]) if writer else None
        if "NCCL WARN" in line:
            m = NCCL_PEER.search(line)
            if m:
                host = NCCL_WRITER.search(line)
                out.append({"writer_host": host["host"] if host else None, "writer_rank": w_rank,
                            "peer": m["peer"], "via": "NCCL", "line": excerpt})
            continue
        if WATCHDOG.search(line) and w_rank is not None:
            out.append({"writer_host": None, "writer_rank": w_rank, "waited": True, "via": "torch watchdog",
                        "line": excerpt})
            continue
        m = GLOO_PEER.search(line)
        if m:
            out.append({"writer_host": None, "writer_rank": w_rank, "peer": m["peer"], "via": "gloo",
                        "line": excerpt})
            continue
        pg = PG_PREFIX.search(line)
        if pg:  # a new report (its "[R] Timeout at collective" line follows)
            pg_default, self_rank, self_seq = pg["pg"] == "0" or pg["desc"] == "default_pg", None, None
        m = DESYNC_SELF.search(line)
        if m:
            self_rank, self_seq = int(m["rank"]), int(m["seq"])
            continue
        if not pg_default:
            continue
        for pattern in (DESYNC_MISSING, DESYNC_BEHIND, DESYNC_STUCK):
            m = pattern.search(line)
            if not m:
                continue
            ranks = _ranks(m["ranks"])
            if pattern is not DESYNC_MISSING and (self_seq is None or int(m["seq"]) >= self_seq):
                break  # ranks at the writer's own collective (it waits there too, or it is the one behind): none
                # of them is behind it
            out.append({"writer_host": None, "writer_rank": self_rank, "ranks": ranks, "via": "torch desync report",
                        "line": excerpt})
            break
    return out


def read_log(path, start: int = 0) -> str:
    """The attempt's part of the job's output (from byte `start`; at most its last MAX_READ bytes)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            fh.seek(max(int(start), size - MAX_READ, 0))
            return fh.read().decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return ""


def _norm(name: str) -> str:
    name = name.strip().lower().strip("[]")
    if name.startswith("::ffff:") and "." in name:
        name = name[7:]  # an IPv4-mapped IPv6 address
    return name.split("%", 1)[0]


def _key(name: str) -> list[str]:
    """A name's forms: itself and, for a host name (not an address), its short form."""
    n = _norm(name)
    short = n.split(".", 1)[0]
    return [n] if _is_ip(n) or short == n else [n, short]


def _is_ip(name: str) -> bool:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, name)
            return True
        except (OSError, ValueError):
            continue
    return False


def addresses(resolve_s: float = RESOLVE_S) -> dict:
    """This host's names and IP addresses (loopback left out: every node has it), for its `hosts` record. The
    resolver's part (the FQDN, the names' addresses) gets `resolve_s` seconds: the preflight runs this before
    torchrun on every node, and a node with broken DNS must not hold the job up (the interfaces' own addresses need
    no resolver)."""
    host = socket.gethostname()
    found: dict = {}

    def resolve() -> None:
        names, ips = {host}, set()
        try:
            names.add(socket.getfqdn())
        except OSError:
            pass
        for name in list(names):
            try:
                ips.update(info[4][0] for info in socket.getaddrinfo(name, None))
            except OSError:
                pass
        found["both"] = (names, ips)  # one assignment: all of it, or nothing (a late answer is dropped)

    worker = threading.Thread(target=resolve, daemon=True)
    worker.start()
    worker.join(resolve_s)
    names, ips = found.get("both", ({host}, set()))
    ips = set(ips) | _interface_ips()
    ips = {_norm(ip) for ip in ips}
    return {"names": sorted(n for n in names if n and not n.startswith("localhost")),
            "ips": sorted(ip for ip in ips if not _loopback(ip))}


def _loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip == "::1"


def _interface_ips() -> set[str]:
    """Every interface's IPv4 address (SIOCGIFADDR) and IPv6 addresses (/proc/net/if_inet6): Linux."""
    found: set[str] = set()
    try:
        import fcntl
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                try:
                    packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
                    found.add(socket.inet_ntoa(packed[20:24]))
                except OSError:
                    continue
    except (ImportError, OSError, AttributeError):
        pass
    try:
        with open("/proc/net/if_inet6") as fh:
            for row in fh:
                hexaddr = row.split()[0]
                found.add(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(hexaddr)))
    except (OSError, ValueError, IndexError):
        pass
    return found


def rank_nodes(records: list[dict], attempt: int) -> dict:
    """{rank: node} of the attempt's `rank` records (every rank at start)."""
    return {r.get("rank"): r.get("node") for r in records if r.get("event") == "rank" and r.get("attempt") == attempt}


# what an exception says when a collective or its connection failed under this rank (a lost peer), rather than the
# rank failing on its own: torch's distributed error types, the backends' names, the socket errors
PEER_ERROR_WORDS = ("distbackenderror", "distnetworkerror", "diststoreerror", "nccl", "rccl", "gloo",
                    "processgroup", "connection closed", "connection reset", "connection refused", "broken pipe")


def from_a_peer(text: str) -> bool:
    """Whether an exception's text (`Type: message`) is a failed collective or connection, not the rank's own error."""
    low = text.lower()
    return any(w in low for w in PEER_ERROR_WORDS) or bool(GLOO_PEER.search(text) or NCCL_PEER.search(text))


def named(findings: list[dict], records: list[dict], attempt: int, job_nodes: list[str]) -> dict[str, str]:
    """{node: why} that the findings blame. A named host, address or rank counts only where it maps onto exactly
    one of the job's nodes (the attempt's `hosts` and `rank` records), and not where the writer names its own node
    (a broken connection between two ranks of one node does not say which one failed; the node's own faults are
    recorded by its ranks). Every finding is a vote of its writer (a node, else a rank, else one unknown writer):
    the nodes with the most votes are named (one dead node is named by all of its peers, and their own aborts then
    make their peers name them: fewer votes). A node whose own rank failed with a software error (an `error` record)
    is never named: its peers lost it because of that failure. Nobody is named when the most-voted nodes are all of the job's nodes
    (they named each other: a link between them, or a network-wide fault) or more than half of them."""
    hosts = [r for r in records if r.get("event") == "hosts" and r.get("attempt") == attempt
             and r.get("node") in job_nodes]
    # a node one of whose ranks failed on its own (an `error` record: a software error, not a lost peer) closed its
    # connections because of that failure: its peers naming it say nothing about the node
    origin = {r.get("node") for r in records if r.get("event") == "error" and r.get("attempt") == attempt}
    by_name: dict[str, set[str]] = {}
    for node in job_nodes:  # a Slurm node name is usually its host name (and needs no hosts line of a node that
        by_name.setdefault(_norm(node), set()).add(node)  # died before its preflight wrote one)
    for h in hosts:
        for name in [h["node"], *(h.get("names") or []), *(h.get("ips") or [])]:
            for key in _key(str(name)):
                by_name.setdefault(key, set()).add(h["node"])
    by_rank = {rank: node for rank, node in rank_nodes(records, attempt).items() if node in job_nodes}

    def node_of(name: str) -> str | None:
        nodes = set().union(*(by_name.get(k, set()) for k in _key(name)))
        return next(iter(nodes)) if len(nodes) == 1 else None

    votes: dict[str, set[str]] = {}
    first: dict[str, dict] = {}
    for f in findings:
        writer = (node_of(f["writer_host"]) if f.get("writer_host") else None) or by_rank.get(f.get("writer_rank"))
        targets = {node_of(f["peer"])} if f.get("peer") else {by_rank.get(r) for r in f.get("ranks") or []}
        voter = writer or (f"rank {f['writer_rank']}" if f.get("writer_rank") is not None else "?")
        for node in targets - {None, writer} - origin:
            votes.setdefault(node, set()).add(voter)
            first.setdefault(node, f)
    if not votes:
        return {}
    top = max(len(v) for v in votes.values())
    winners = sorted(n for n, v in votes.items() if len(v) == top)
    if set(winners) >= set(job_nodes) or len(winners) > max(1, len(job_nodes) // 2):
        return {}
    return {n: f"{first[n]['via']} named it ({len(votes[n])} writer(s): {', '.join(sorted(votes[n]))}): "
               f"{first[n]['line']}" for n in winners}


def waits(findings: list[dict], records: list[dict], attempt: int) -> list[dict]:
    """{rank, node, why} of each rank whose watchdog said it waited (once a rank; the `rank` records map it)."""
    by_rank = rank_nodes(records, attempt)
    out: dict[int, dict] = {}
    for f in findings:
        node = by_rank.get(f.get("writer_rank"))
        if f.get("waited") and isinstance(node, str):
            out.setdefault(f["writer_rank"], {"rank": f["writer_rank"], "node": node, "why": f["line"]})
    return [out[r] for r in sorted(out)]
