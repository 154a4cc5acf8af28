"""Handing held copies to another process: ``transfer`` in one, ``seize_copy`` in the other.

    python examples/transfer.py [HOST:PORT]

Figure 6 of the Charon paper. With ``descriptors/held-resources.yaml`` loaded, process 1
holds four copies of a ``workers`` customer, stages three of them for another process
(``transfer``, with a 30 s time to live) and sends the transfer id through a pipe. Process
2, with a client of its own (and its own session, possibly on another ferryman replica),
seizes them, gives one back and ends its block, which releases the rest. Process 1 still
has its one copy until its own block ends. The target defaults to 127.0.0.1:8081.
"""

from __future__ import annotations

import multiprocessing
import sys
import uuid
from multiprocessing.connection import Connection

import ferryman


def process_2(target: str, conn: Connection) -> None:
    """Receive a transfer id, seize the copies, use them, release them."""
    transfer_id = conn.recv()
    with ferryman.Client(target) as client, client.seize_copy(transfer_id) as res:
        shown = ",".join(f"{k}={v}" for k, v in res.descriptor)
        print(f"process 2: seized {res.copies} copies of {res.domain} {shown}", flush=True)
        res.release(1)
        print(f"process 2: released 1, has {res.copies} until its block ends", flush=True)
        conn.send(res.copies)


def main(target: str) -> int:
    customer = {"customer": f"example-{uuid.uuid4().hex[:8]}"}
    # spawn: a fresh interpreter, as a separate program would be (gRPC dislikes fork).
    mp = multiprocessing.get_context("spawn")
    ours, theirs = mp.Pipe()
    child = mp.Process(target=process_2, args=(target, theirs))
    child.start()
    try:
        with (
            ferryman.Client(target) as client,
            client.hold_copy("workers", customer, copies=4) as res,
        ):
            if not res.success:
                print("process 1: no copies to be had")
                return 1
            print(f"process 1: holds {res.copies} copies", flush=True)
            transfer_id = res.transfer(3, ttl=30)
            print(f"process 1: staged 3 for process 2, has {res.copies}", flush=True)
            ours.send(transfer_id)
            seized = ours.recv()
            child.join(30)
            print(f"process 1: process 2 had {seized} left and exited {child.exitcode}")
            print(f"process 1: still has {res.copies}")
            if res.degraded:
                print("(degraded: the service did not answer, the copies were local)")
            return 0 if child.exitcode == 0 and res.copies == 1 else 1
    finally:
        if child.is_alive():
            child.kill()
        child.join(10)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8081"))
