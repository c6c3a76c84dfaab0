"""Running handlers: a batch's state and decisions (`core`), the handler slots and
the runners that carry them (`slots`, `runners`), the batch's run loop (`batch`),
what becomes of a batch (`outcome`), the drain's session (`session`) and the drain
loop itself (`drain`). Nothing here holds SQL text: statements are drainer.storage's.

This package's `__init__` imports nothing, so that `outcome` (describe, trace) can
be imported from the bottom of the stack without the batch."""
