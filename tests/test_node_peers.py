"""A failed collective that names its peer (primus_contract/peer_faults.py): real-format lines from NCCL, gloo and
torch's desync report, through the parser and through `settle`/`suspects` on synthetic logs/nodes.jsonl records.
No Slurm, no torch: milliseconds."""
from __future__ import annotations

import json

from primus_contract import node_faults, node_ledger, peer_faults

# NVIDIA/nccl issue #2397 (NCCL 2.30.4, RoCE, two hosts), "Share Your Debug Logs", verbatim except the markdown
# link the renderer made of "p2p.cc:648": ubuntu2 (10.153.235.11) and ubuntu4 (10.153.235.13) each name the
# other (src/transport/net_ib/p2p.cc: WARN("NET/IB: Got completion from peer %s with status=%s(%d) ...")).
NCCL_2_30 = """\
[2026-09-09 10:46:33] ubuntu2:319733:319761 [1] transport/net_ib/p2p.cc:783 NCCL WARN NET/IB: ncclIbTest: Got CQE with error (devIndex=0, req=0x7fccfc04e028, comm=0x7fccfc04e000 (recv), wr_id=0, qp_num=26257)
[2026-09-09 10:46:33] ubuntu2:319733:319761 [1] transport/net_ib/p2p.cc:648 NCCL WARN NET/IB: Got completion from peer 10.153.235.13<40554> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RECV_RDMA_WITH_IMM(129) vendor_err=129 localGid ::ffff:1.1.2.2 remoteGids::ffff:1.1.1.4 hca mlx5_1
[2026-09-09 10:46:34] ubuntu4:250415:250528 [1] transport/net_ib/p2p.cc:648 NCCL WARN NET/IB: Got completion from peer 10.153.235.11<52743> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RDMA_WRITE(1) vendor_err=129 localGid ::ffff:1.1.1.4 remoteGids::ffff:1.1.2.2 hca mlx5_0
[2026-09-09 10:46:34] ubuntu4:250414:250527 [0] transport/net_ib/p2p.cc:648 NCCL WARN NET/IB: Got completion from peer 10.153.235.11<38830> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RDMA_WRITE(1) vendor_err=129 localGid ::ffff:1.1.1.4 remoteGids::ffff:1.1.2.2 hca mlx5_0
ubuntu4:250414:250527 [0] NCCL INFO transport/net.cc:1227 -> 6
"""
# stas00/ml-engineering debug/pytorch.md (an older NCCL: net_ib.cc "NET/IB : Got completion from peer %s with error
# %d, opcode %d, len %d, vendor err %d (%s)"), the line the page wraps joined again.
NCCL_2_18 = ("node-2:5776:5902 [0] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from peer "
             "10.2.0.5<33092> with error 12, opcode 0, len 0, vendor err 129 (Recv)")
# NVIDIA/nccl src/misc/socket.cc socketProgress: WARN("socketProgress: Connection closed by remote peer %s",
# ncclSocketToString(&sock->addr, line, 0)) (a host name: getnameinfo without NI_NUMERICHOST), after src/debug.cc's
# "%s:%d:%d " and "[%d] %s:%d NCCL WARN %s" prefix
SOCKET = ("node-{w}:4410:4470 [3] misc/socket.cc:58 NCCL WARN socketProgress: Connection closed by remote peer "
          "{p}<53021>")
# Printed here by torch 2.13 (gloo, the CPU backend) on rank 0 when rank 1 died mid-all_reduce; the address changed
GLOO = ("[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
        "closed by peer [10.2.0.5]:31432. This is typically caused by a remote worker crashing. Check the logs of the "
        "remote worker before reporting an error.")
# pytorch torch/csrc/distributed/c10d: ProcessGroupNCCL.cpp `LOG(ERROR) << logPrefix() << desyncMsg`, logPrefix
# "[PG ID %d PG GUID %s(%s) Rank %d] ", TraceUtils.h retrieveDesyncReport / analyzeMissingRanks /
# analyzeLaggingRanks (the c10 log header before it is illustrative)
DESYNC = ("[rank0]:[E1205 01:12:40.512 4471 ProcessGroupNCCL.cpp:1664] [PG ID {pg} PG GUID {pg}({desc}) Rank 0] \n"
          "\t - [0] Timeout at collective: ALLREDUCE, #12{rest}\n")
MISSING = ("\n\t - To our best knowledge, ranks [2, 3] are the lagging ranks that caused this timeout. They never "
           "joined any collectives")
LAGGING = ("\n\t - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:"
           "\n\t   - [0, 1] joined but didn't finish collective #12 (count from 1)"
           "\n\t     [2, 3] finished collective #11, but didn't join collective #12 (count from 1)")


def _hosts(attempt=0, **nodes):
    """hosts records: node=(names, ips)."""
    return [{"event": "hosts", "attempt": attempt, "node": n, "names": names, "ips": ips}
            for n, (names, ips) in nodes.items()]


FOUR = _hosts(**{"node-1": (["node-1"], ["10.2.0.3"]), "node-2": (["node-2.cluster"], ["10.2.0.4"]),
                 "node-5": (["node-5"], ["10.2.0.5", "fe80::5"]), "node-7": (["node-7"], ["10.2.0.7"])})
NODES4 = ["node-1", "node-2", "node-5", "node-7"]


def test_real_nccl_lines_name_their_peer_and_writer():
    found = peer_faults.parse(NCCL_2_30)
    assert [(f["writer_host"], f["peer"]) for f in found] == [
        ("ubuntu2", "10.153.235.13"), ("ubuntu4", "10.153.235.11"), ("ubuntu4", "10.153.235.11")]
    assert peer_faults.parse(NCCL_2_18)[0]["peer"] == "10.2.0.5"
    assert peer_faults.parse(SOCKET.format(w=1, p="node-5"))[0] | {"line": ""} == {
        "writer_host": "node-1", "writer_rank": None, "peer": "node-5", "via": "NCCL", "line": ""}
    assert peer_faults.parse(GLOO)[0] | {"line": ""} == {
        "writer_host": None, "writer_rank": 0, "peer": "10.2.0.5", "via": "gloo", "line": ""}
    assert peer_faults.parse("x:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE; OOB eth0:10.2.0.4<0>") == []


def test_two_nodes_that_name_each_other_name_neither():
    records = _hosts(ubuntu2=(["ubuntu2"], ["10.153.235.11"]), ubuntu4=(["ubuntu4"], ["10.153.235.13"]))
    found = peer_faults.parse(NCCL_2_30)
    assert peer_faults.named(found, records, 0, ["ubuntu2", "ubuntu4"]) == {}
    # ubuntu2's line alone names ubuntu4
    named = peer_faults.named(found[:1], records, 0, ["ubuntu2", "ubuntu4"])
    assert list(named) == ["ubuntu4"] and "NCCL named it (1 writer(s): ubuntu2)" in named["ubuntu4"]


def test_the_node_most_peers_name_is_named_not_the_ones_its_death_took_down():
    text = "\n".join([NCCL_2_18,                                    # node-2 names 10.2.0.5
                      SOCKET.format(w=1, p="node-5.cluster"),       # node-1 names it by its long name
                      SOCKET.format(w=7, p="node-2"),               # node-2's abort, seen from node-7: one vote
                      SOCKET.format(w=5, p="node-5"),               # a node naming itself: not counted
                      SOCKET.format(w=7, p="10.9.9.9")])            # nobody's address: not counted
    named = peer_faults.named(peer_faults.parse(text), FOUR, 0, NODES4)
    assert list(named) == ["node-5"] and "2 writer(s): node-1, node-2" in named["node-5"]
    # many ranks of one node naming the peer are one vote; an address two nodes share names neither
    shared = FOUR + _hosts(**{"node-7": (["node-7"], ["10.2.0.5"])})
    assert peer_faults.named(peer_faults.parse(NCCL_2_18 * 1), shared, 0, NODES4) == {}
    # another attempt's hosts do not map anything
    assert peer_faults.named(peer_faults.parse(NCCL_2_18), FOUR, 1, NODES4) == {}


def test_gloo_and_the_desync_report_name_ranks_through_the_rank_records():
    ranks = [{"event": "rank", "attempt": 0, "rank": r, "node": n} for r, n in enumerate(["a", "a", "b", "b"])]
    hosts = _hosts(a=(["a"], ["10.2.0.4"]), b=(["b"], ["10.2.0.5"]))
    assert list(peer_faults.named(peer_faults.parse(GLOO), hosts + ranks, 0, ["a", "b", "c"])) == ["b"]
    for rest in (MISSING, LAGGING):
        found = peer_faults.parse(DESYNC.format(pg=0, desc="default_pg", rest=rest))
        assert [f["ranks"] for f in found] == [[2, 3]], rest  # not [0, 1]: the writer waits at #12 with them
        named = peer_faults.named(found, ranks, 0, ["a", "b", "c"])
        assert list(named) == ["b"] and "torch desync report named it (1 writer(s): a)" in named["b"]
    # a subgroup's report counts its own ranks: not the job's
    assert peer_faults.parse(DESYNC.format(pg=3, desc="DATA_PARALLEL_GROUP", rest=MISSING)) == []


def _timeouts(*nodes):
    return [{"event": "timeout", "attempt": 0, "node": n, "rank": i, "t": 100.0} for i, n in enumerate(nodes)]


def test_settle_makes_the_named_peer_suspect_once_and_requeues_away_from_it(tmp_path):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    ranks = [{"event": "rank", "attempt": 0, "rank": r, "node": n} for r, n in enumerate(NODES4)]
    # ranks on node-1, node-2, node-5 waited (the guess from who timed out would name node-7); node-5 is named
    records = FOUR + ranks + _timeouts("node-1", "node-2", "node-5")
    node_ledger.append(run / "logs" / "nodes.jsonl", [json.dumps(r) for r in records])
    log = tmp_path / "slurm-9.out"
    log.write_text("an earlier attempt's line naming node-7: " + SOCKET.format(w=1, p="node-7") + "\n")
    start = log.stat().st_size
    with open(log, "a") as fh:
        fh.write("\n".join([NCCL_2_18, SOCKET.format(w=1, p="node-5")]) + "\n")
    ledger = tmp_path / "ledger.jsonl"
    args = dict(job_nodes=NODES4, ledger=ledger, requeue=True, excluded=[], partition_nodes=NODES4 + ["node-8"])
    line = node_faults.settle(run, 0, "9", 1, log=str(log), log_start=start, **args)
    assert line.startswith("requeue node-5 | suspect: node-5 (timeout: NCCL named it (2 writer(s)"), line
    assert [(r["node"], r["state"]) for r in node_ledger.read(ledger)] == [("node-5", "suspect")]
    attempt = [r for r in node_faults.read(run) if r["event"] == "attempt"][0]
    assert attempt["node"] == "node-5" and attempt["suspects"] == ["node-5"]
    # without the log: the guess from who timed out (node-7 never did), as before
    assert node_faults.suspects(records, 0, NODES4) == {"node-7": node_faults.suspects(records, 0, NODES4)["node-7"]}
    # a finished attempt's output is not read
    run2 = tmp_path / "run2"
    (run2 / "logs").mkdir(parents=True)
    node_ledger.append(run2 / "logs" / "nodes.jsonl", [json.dumps(r) for r in FOUR])
    assert node_faults.settle(run2, 0, "9", 0, log=str(log), **args).startswith("end - | no failure named a node")


def test_settle_reads_the_log_from_the_command_line(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    node_ledger.append(run / "logs" / "nodes.jsonl", [json.dumps(r) for r in FOUR])
    log = tmp_path / "out"
    log.write_text(SOCKET.format(w=2, p="node-7") + "\n")
    assert node_faults.main(["settle", "--run-dir", str(run), "--attempt", "0", "--job", "5", "--rc", "1",
                             "--nodes", ",".join(NODES4), "--log", str(log), "--log-start", "x"]) == 0
    assert capsys.readouterr().out.startswith("end node-7 | suspect: node-7 (timeout: NCCL named it")
    assert node_faults.main(["settle", "--run-dir", str(run), "--attempt", "0", "--job", "5", "--rc", "1",
                             "--log", str(tmp_path / "missing")]) == 0


def test_this_hosts_addresses_leave_loopback_out():
    mine = peer_faults.addresses()
    assert mine["names"] and not any(ip.startswith("127.") or ip == "::1" for ip in mine["ips"])


# ProcessGroupNCCL.cpp's watchdog line after torch's "[rankN]:" log prefix (the WorkNCCL text is its operator<<)
WATCHDOG = ("[rank{r}]:[E1205 01:12:40.512 4471 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
            "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, "
            "NumelOut=1, Timeout(ms)=600000) ran for 600013 milliseconds before timing out.")


def test_ranks_whose_nccl_watchdog_aborted_them_feed_the_hang_guess(tmp_path):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    ranks = [{"event": "rank", "attempt": 0, "rank": r, "node": n} for r, n in enumerate(["a", "a", "b", "b", "c"])]
    node_ledger.append(run / "logs" / "nodes.jsonl", [json.dumps(r) for r in ranks])
    log = tmp_path / "out"
    log.write_text("\n".join(WATCHDOG.format(r=r) for r in (0, 1, 2, 3, 0)) + "\n")  # c's rank never timed out
    found = peer_faults.parse(log.read_text())
    assert [f["writer_rank"] for f in found] == [0, 1, 2, 3, 0] and peer_faults.named(found, ranks, 0, list("abc")) == {}
    line = node_faults.settle(run, 0, "7", 134, list("abc"), "", False, [], [], log=str(log))
    assert line.startswith("end c | suspect: c (hang: its ranks [4] never timed out while 4 rank(s) on a, b waited")
    waited = [r for r in node_faults.read(run) if r["event"] == "timeout"]
    assert [(r["rank"], r["node"], r["seen"]) for r in waited] == [(0, "a", "log"), (1, "a", "log"), (2, "b", "log"),
                                                                   (3, "b", "log")]


def test_a_rank_that_failed_on_its_own_or_a_stop_on_purpose_blames_no_peer(tmp_path):
    """When a rank exits, the kernel closes its sockets and its peers print "Connection closed by remote peer": that
    names a node whatever ended the rank (review, 2026-12-05). A node whose own rank recorded a software error
    (`error`) is not named; an attempt that ended on purpose (the trainer's own codes; a stop signal that reached
    the job script) is not read."""
    text = "\n".join([SOCKET.format(w=1, p="node-5"), SOCKET.format(w=2, p="node-5")])
    assert list(peer_faults.named(peer_faults.parse(text), FOUR, 0, NODES4)) == ["node-5"]
    own = FOUR + [{"event": "error", "attempt": 0, "node": "node-5", "rank": 3, "why": "OSError: [Errno 28] No space"}]
    assert peer_faults.named(peer_faults.parse(text), own, 0, NODES4) == {}
    assert peer_faults.named(peer_faults.parse(text), [*own[:-1], {**own[-1], "attempt": 1}], 0, NODES4)  # another
    # what the trainer records as a rank's own failure, and what it leaves to the peer logic
    assert not peer_faults.from_a_peer("OSError: [Errno 28] No space left on device")
    assert not peer_faults.from_a_peer("ValueError: trainer.lora.dim must be positive")
    assert peer_faults.from_a_peer(GLOO.split("]: ", 1)[1])
    assert peer_faults.from_a_peer("DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:2015, remote process exited")
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    node_ledger.append(run / "logs" / "nodes.jsonl", [json.dumps(r) for r in FOUR])
    log = tmp_path / "out"
    log.write_text(text + "\n")
    args = dict(job_nodes=NODES4, ledger=tmp_path / "ledger.jsonl", requeue=True, excluded=[],
                partition_nodes=NODES4 + ["node-8"])
    for rc in (2, 3, 4):  # the trainer's own decisions
        assert node_faults.settle(run, 0, "9", rc, log=str(log), **args).startswith("end - | no failure named"), rc
    for rc in (node_faults.EXIT_STOPPED, 143):  # a cancel or the warning reached the job script
        assert node_faults.settle(run, 0, "9", rc, log=str(log), stopped=True, **args).startswith("end - | no "), rc
    # without the stop: srun ended the other tasks (143), or the trainer stopped there (75), after one failed
    assert node_faults.settle(run, 0, "9", 143, log=str(log), **args).startswith("requeue node-5 |")


def test_a_resolver_that_hangs_does_not_hold_the_preflight(monkeypatch):
    """addresses() runs before torchrun on every node: a node with broken DNS gives its host name and its
    interfaces' addresses after resolve_s, not after the resolver's own timeouts (review, 2026-12-05)."""
    import socket
    import time

    def hang(*_args, **_kw):
        time.sleep(5)
        return "late.example"

    monkeypatch.setattr(socket, "getfqdn", hang)
    mine = peer_faults.addresses(resolve_s=0.2)  # (had it waited for the resolver, late.example would be there)
    assert mine["names"] == sorted({socket.gethostname()} - {"localhost"}) and "late.example" not in mine["names"]
