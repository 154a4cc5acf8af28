"""Held resources from Python: ``hold_copy`` blocks and a multi-resource hold.

    python examples/hold_copy.py [HOST:PORT]

With ``descriptors/held-resources.yaml`` and ``descriptors/burst-cookbook.yaml`` loaded, a
customer of ``workers`` may hold four copies at a time. The example holds three for a
block, gives one back early, and shows that a block that raises still gives its copies
back. Then it asks for four copies of ``customer`` together with four hits of
``simple_user`` (five per second, three already spent): the multi-resource hold settles on
two of each, releasing the surplus copies. The target defaults to 127.0.0.1:8081; exit
status 1 if a step did not go as described.
"""

from __future__ import annotations

import sys
import uuid

import ferryman


def main(target: str) -> int:
    name = f"example-{uuid.uuid4().hex[:8]}"
    customer = {"customer": name}
    ok = True
    with ferryman.Client(target) as client:
        # Figure 5 of the paper: the copies are released when the block ends.
        with client.hold_copy("workers", customer, copies=3) as res:
            if res.success:
                context = res.context
                limit = context.limit if context else None
                print(f"holding {res.copies} copies (limit {limit}, groups {list(res.groups)})")
                res.release(1)  # done with one early
                print(f"released 1 early, holding {res.copies}")
            ok &= res.success and res.copies == 2
            if res.degraded:
                print("(degraded: the service did not answer, the client granted locally)")

        try:
            with client.hold_copy("workers", customer, copies=4) as res:
                print(f"holding all {res.copies} copies, then failing")
                raise RuntimeError("the job failed")
        except RuntimeError as error:
            print(f"block raised {error!r}; its copies were given back")
        with client.hold_copy("workers", customer, copies=4) as res:
            print(f"afterwards all {res.copies} copies are free again: success={res.success}")
            ok &= res.copies == 4

        # Figure 7: copy-limited resources first, the one rate-limited resource last.
        user = {"simple_user": name}
        client.request_rate("cookbook", user, copies=3)  # leaves 2 hits this second
        resources = [
            ferryman.Resource("workers", customer),
            ferryman.Resource("cookbook", user, rate_limited=True),
        ]
        with client.hold_resources(resources, copies=4, min_copies=1, max_wait=2) as got:
            print(
                f"multi-resource: success={got.success} copies={got.copies} "
                f"(held {[h.copies for h in got.holds]}, hits {got.rate.copies if got.rate else 0})"
            )
            ok &= got.success and got.copies == 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8081"))
