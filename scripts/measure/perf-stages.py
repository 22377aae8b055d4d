#!/usr/bin/env python3
"""Per-stage CPU profile of the gateway from `perf` samples (docs/performance.md).

Usage:
    perf record -a -F 999 -o perf.data -- env FILAMENT_BENCH_ONLY_K=8 scripts/bench.sh
    perf script -i perf.data -F comm,pid,tid,ip,sym,dso | scripts/measure/perf-stages.py

Samples are grouped by process; the gateway is the process that has samples in the
`filament-bigquery` executable. Each of its samples is put in one stage by its symbol and
library (first matching rule below); the table gives each stage's share of the gateway's
samples. Kernel samples are split by what the kernel was doing for the process: receiving
(copying to user space, TCP receive), sending (copying from user space, TCP transmit) or
faulting pages in; the rest of the kernel is scheduling and wakeups.
"""

import collections
import re
import sys

# (stage, pattern on "symbol (library)"), first match wins.
RULES = [
    ("compress (ISA-L gzip)", r"\(.*libisal|isal_|deflate"),
    ("hash (SHA-256 of the body)", r"sha2::|sha256"),
    ("copy (memcpy/memmove/memset)", r"__mem(move|cpy|set)|memcpy"),
    ("receive (kernel: TCP receive, copy to user)", r"_copy_to_iter|tcp_recv|tcp_v4_rcv|tcp_rcv|skb_copy_datagram|__skb_datagram|tcp_cleanup_rbuf|sock_recvmsg|tcp_ack"),
    ("send (kernel: TCP transmit, copy from user)", r"_copy_from_iter|tcp_sendmsg|__tcp_transmit|tcp_write_xmit|ip_(output|finish|queue)|__dev_queue|loopback|sock_sendmsg|__check_object_size"),
    ("page faults (kernel)", r"page_fault|do_anonymous_page|clear_page|handle_mm_fault|__handle_mm|unmap_page|free_frozen|folio|zap_|__alloc_pages|get_page_from_freelist|rmqueue"),
    ("validate and convert (Arrow decode, UTF-8, casts)", r"arrow|from_utf8|flatbuffers|filament_bigquery::ingest"),
    ("HTTP and gRPC (hyper, h2, tonic, prost)", r"hyper|h2::|tonic|prost|http_body|axum|tower"),
    ("Postgres client (sqlx)", r"sqlx"),
    ("allocator (jemalloc)", r"jemalloc|_rjem|je_"),
    ("scheduling and wakeups (tokio, kernel)", r"tokio|kallsyms|\[unknown\]"),
]


def stage_of(symbol_and_dso):
    for stage, pattern in RULES:
        if re.search(pattern, symbol_and_dso):
            return stage
    return "other"


def main():
    per_process = collections.defaultdict(collections.Counter)
    gateway_pids = set()
    for line in sys.stdin:
        match = re.match(r"\s*(.+?)\s+(\d+)/(\d+)\s+[0-9a-f]+\s+(.*)$", line)
        if not match:
            continue
        pid, rest = match.group(2), match.group(4)
        per_process[pid][rest] += 1
        if rest.endswith("/filament-bigquery)"):
            gateway_pids.add(pid)
    if not gateway_pids:
        sys.exit("no samples in the filament-bigquery executable")
    stages = collections.Counter()
    for pid in gateway_pids:
        for rest, count in per_process[pid].items():
            stages[stage_of(rest)] += count
    total = sum(stages.values())
    print(f"gateway samples: {total} (processes {', '.join(sorted(gateway_pids))})\n")
    print("| Share of gateway CPU | Stage |")
    print("|---|---|")
    for stage, count in stages.most_common():
        print(f"| {100.0 * count / total:.0f}% | {stage} |")


if __name__ == "__main__":
    main()
