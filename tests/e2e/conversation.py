"""A long, deterministic coding conversation for the end-to-end scenarios.

Each turn shows the assistant one source file of a small made-up project (an inventory
service) and asks a short question about it, so that the history grows by a few hundred tokens
a turn and the summaries have real facts to keep (paths, names, decisions).

`python3 conversation.py [N]` prints N turns (default 60) as a JSON list of strings; the Node
scenario reads that, so both SDK scenarios hold the same conversation.
"""

import json
import sys

SYSTEM = (
    "You are a terse senior engineer reviewing the inventory-service repository with the user. "
    "Answer in one or two short sentences."
)

MODULES = [
    ("src/inventory/models.py", "Item", "sku"),
    ("src/inventory/store.py", "StockStore", "quantity"),
    ("src/inventory/pricing.py", "PriceBook", "unit_price"),
    ("src/inventory/orders.py", "OrderBook", "order_id"),
    ("src/inventory/shipping.py", "Shipment", "tracking_code"),
    ("src/inventory/audit.py", "AuditTrail", "event_id"),
    ("src/inventory/alerts.py", "LowStockAlert", "threshold"),
    ("src/inventory/reports.py", "WeeklyReport", "week"),
    ("src/inventory/suppliers.py", "Supplier", "supplier_code"),
    ("src/inventory/returns.py", "ReturnRequest", "rma"),
    ("src/inventory/cache.py", "LruCache", "capacity"),
    ("src/inventory/api.py", "InventoryApi", "route"),
]

QUESTIONS = [
    "What is the riskiest part of {path}?",
    "Name one bug you would look for in {cls}.",
    "Should {field} in {cls} be validated earlier? Answer yes or no and why.",
    "Suggest one test for {path}.",
    "Which function in {path} would you rename, and to what?",
]


class Progress:
    """What the `x-compactor-*` headers of a scenario's turns showed so far: the checkpoints
    seen (in order), the model's window, and the largest history the proxy measured."""

    def __init__(self) -> None:
        self.checkpoints: list[str] = []
        self.window: int | None = None
        self.max_before = 0

    def record(self, turn: int, headers) -> dict:
        """One turn's headers; raises ValueError when there are none or the compaction failed."""
        compacted = headers.get("x-compactor-compacted")
        if compacted is None:
            raise ValueError(f"turn {turn + 1}: no x-compactor-* headers: is COMPACTOR_URL the proxy?")
        before = int(headers.get("x-compactor-tokens-before", "0"))
        self.window = int(headers.get("x-compactor-context-window", "0")) or self.window
        self.max_before = max(self.max_before, before)
        checkpoint = headers.get("x-compactor-checkpoint")
        new = checkpoint is not None and checkpoint not in self.checkpoints
        if new:
            self.checkpoints.append(checkpoint)
        status = headers.get("x-compactor-compaction", "")
        seen = {"compacted": compacted, "before": before, "window": self.window,
                "after": headers.get("x-compactor-tokens-after"), "checkpoint": checkpoint,
                "new": new, "status": status}
        if status.startswith("failed"):
            raise ValueError(f"turn {turn + 1}: compaction failed: {status} ({describe(seen)})")
        return seen

    def reached(self, history_factor: float, min_compactions: int) -> bool:
        return bool(self.window) and self.max_before >= history_factor * self.window \
            and len(self.checkpoints) >= min_compactions

    def gave_up(self, max_turns: int) -> str:
        return (f"gave up after {max_turns} turns: history {self.max_before} tokens "
                f"(window {self.window}), {len(self.checkpoints)} compactions")


def describe(seen: dict) -> str:
    """A turn's headers as one log fragment."""
    return (f"compacted={seen['compacted']} before={seen['before']} after={seen['after']} "
            f"window={seen['window']} checkpoint={seen['checkpoint'] or '-'}"
            f"{' NEW' if seen['new'] else ''}{' status=' + seen['status'] if seen['status'] else ''}")


def source_file(turn: int) -> tuple[str, str]:
    path, cls, field = MODULES[turn % len(MODULES)]
    version = turn // len(MODULES) + 1
    funcs = []
    for k in range(5):
        name = f"{['load', 'save', 'apply', 'check', 'merge'][k]}_{field}_v{version}"
        funcs.append(
            f"    def {name}(self, {field}, limit={10 * (k + 1) + turn}):\n"
            f"        \"\"\"Step {k + 1} of the {cls} workflow (revision {version}).\"\"\"\n"
            f"        if {field} is None:\n"
            f"            raise ValueError('{cls}.{name}: missing {field}')\n"
            f"        values = [v for v in self._rows.get({field}, []) if v < limit]\n"
            f"        self._log.append(('{name}', {field}, len(values)))\n"
            f"        return sum(values) / max(len(values), 1)\n"
        )
    code = (
        f"# {path} (revision {version})\n"
        f"class {cls}:\n"
        f"    \"\"\"Keeps {field} records for the inventory service.\"\"\"\n\n"
        f"    def __init__(self, rows=None):\n"
        f"        self._rows = dict(rows or {{}})\n"
        f"        self._log = []\n\n" + "\n".join(funcs)
    )
    question = QUESTIONS[turn % len(QUESTIONS)].format(path=path, cls=cls, field=field)
    return code, question


def user_turn(turn: int) -> str:
    code, question = source_file(turn)
    return f"Turn {turn + 1}. Here is the current file:\n\n```python\n{code}```\n\n{question}"


def turns(n: int) -> list[str]:
    return [user_turn(i) for i in range(n)]


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    json.dump({"system": SYSTEM, "turns": turns(count)}, sys.stdout)
