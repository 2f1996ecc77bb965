"""Drawing code of the `::figure` directive: engine state captured by a chapter main -> inline SVG.

A chapter main run with MINISGL_CAPTURE_DIR set writes `<dir>/chNN_slug.<name>.json`, the state
its figure shows; the maintainer stores it under docs/_outputs/. At build time `draw` turns it
into an SVG with one drawing function per figure, so a figure shows what the engine really did.
"""

from __future__ import annotations

from html import escape
from typing import Any, Callable

Drawing = Callable[[Any], tuple[str, str]]  # captured data -> (svg, caption)
DRAWINGS: dict[str, Drawing] = {}


def drawing(name: str) -> Callable[[Drawing], Drawing]:
    """Register the drawing function of figure `name` (chNN_slug.name)."""

    def register(function: Drawing) -> Drawing:
        DRAWINGS[name] = function
        return function

    return register


def draw(name: str, data: Any) -> tuple[str, str]:
    """The SVG and caption of figure `name` from its captured data."""
    if name not in DRAWINGS:
        raise KeyError(f"docs/hooks/figures.py has no drawing for figure {name!r}")
    return DRAWINGS[name](data)


# --- a few SVG primitives ----------------------------------------------------------------------

COLORS = {
    "prefill": "#3f51b5",
    "decode": "#9fa8da",
    "waiting": "#ffcc80",
    "used": "#78909c",
    "reserved": "#ffb74d",
    "free": "#c8e6c9",
    "cached": "#a5d6a7",
    "new": "#3f51b5",
    "pad": "#eeeeee",
    "line": "#616161",
    "text": "#212121",
    "dropped": "#ef9a9a",
}


def svg(width: int, height: int, body: list[str], label: str) -> str:
    """An SVG that scales down with the page; `label` is its accessible description."""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" role="img" aria-label="{escape(label)}" '
        f'style="max-width:100%;height:auto;font-family:sans-serif">' + "".join(body) + "</svg>"
    )


def rect(x: float, y: float, w: float, h: float, fill: str, title: str = "") -> str:
    tooltip = f"<title>{escape(title)}</title>" if title else ""
    return (
        f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" fill="{fill}" '
        f'stroke="#ffffff" stroke-width="1">{tooltip}</rect>'
    )


def text(
    x: float,
    y: float,
    content: Any,
    size: int = 12,
    anchor: str = "start",
    weight: str = "normal",
    fill: str = COLORS["text"],
) -> str:
    return (
        f'<text x="{x:g}" y="{y:g}" font-size="{size}" text-anchor="{anchor}" '
        f'font-weight="{weight}" fill="{fill}">{escape(str(content))}</text>'
    )


def line(x1: float, y1: float, x2: float, y2: float, dash: bool = False) -> str:
    style = ' stroke-dasharray="4 3"' if dash else ""
    return (
        f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="{COLORS["line"]}"'
        f' stroke-width="1"{style}/>'
    )


def legend(x: float, y: float, entries: list[tuple[str, str]]) -> list[str]:
    """Colour swatches with their names, left to right."""
    body = []
    for color, name in entries:
        body += [
            f'<rect x="{x:g}" y="{y - 10:g}" width="12" height="12" fill="{color}" '
            'stroke="#9e9e9e" stroke-width="0.5"/>',
            text(x + 16, y, name, 11),
        ]
        x += 24 + 6.5 * len(name)
    return body


# --- chapter 8: the admission timeline of the 64-slot pool ------------------------------------


def request_states(steps: list[dict]) -> dict[int, list[str]]:
    """Each request's state at each step, derived from who ran and who waited after it: a
    request that starts running was prefilled; one that ran before the step decoded in it (its
    last decode is the step it finished)."""
    uids = sorted({u for s in steps for u in s["running"] + s["waiting"]})
    states: dict[int, list[str]] = {u: [] for u in uids}
    before: set[int] = set()
    for step in steps:
        running = set(step["running"])
        for uid in uids:
            states[uid].append(
                "decode"
                if uid in before
                else "prefill"
                if uid in running
                else "waiting"
                if uid in step["waiting"]
                else ""
            )
        before = running
    return states


@drawing("ch08_cache_manager.admission")
def admission(data: dict) -> tuple[str, str]:
    steps, pages = data["steps"], data["num_pages"]
    states = request_states(steps)
    cell, lane, left, top = 34, 20, 86, 24
    per_page = 2  # pixels per page in the pool chart
    pool_top = top + lane * len(states) + 30
    width = left + cell * len(steps) + 10
    height = pool_top + pages * per_page + 56
    body = [text(left - 8, 14, "step", 11, "end")]
    for i in range(len(steps)):
        body.append(text(left + cell * i + cell / 2, 14, i, 11, "middle"))
    for row, (uid, row_states) in enumerate(states.items()):
        y = top + lane * row
        body.append(text(left - 8, y + 14, f"request {uid}", 12, "end"))
        for i, state in enumerate(row_states):
            if state:
                body.append(
                    rect(
                        left + cell * i,
                        y,
                        cell,
                        lane - 2,
                        COLORS[state],
                        f"step {i}: request {uid} {state}",
                    )
                )
    bottom = pool_top + pages * per_page
    body += [
        text(left - 8, pool_top + 10, f"{pages} pages", 11, "end"),
        text(left - 8, bottom, "0", 11, "end"),
    ]
    for i, step in enumerate(steps):
        used, reserved = pages - step["free"], step["reserved"]
        x, y = left + cell * i + 3, bottom
        for amount, kind in (
            (used, "used"),
            (reserved, "reserved"),
            (step["free"] - reserved, "free"),
        ):
            y -= amount * per_page
            body.append(
                rect(
                    x,
                    y,
                    cell - 6,
                    amount * per_page,
                    COLORS[kind],
                    f"step {i}: {amount} pages {kind}",
                )
            )
    body.append(line(left, bottom, width - 10, bottom))
    body += legend(
        left,
        height - 14,
        [
            (COLORS["prefill"], "prefill"),
            (COLORS["decode"], "decode"),
            (COLORS["waiting"], "waiting"),
            (COLORS["used"], "pages in use"),
            (COLORS["reserved"], "reserved"),
            (COLORS["free"], "free beyond the reservation"),
        ],
    )
    caption = (
        "Admission on a pool of 64 one-token pages: who ran at each step (top), and the "
        "pool after the step (bottom): pages in use, the running requests' reservation, "
        "and what is left."
    )
    return svg(width, height, body, caption), caption


# --- chapter 4: the page table and the pool it points into ------------------------------------

OWNERS = ["#3f51b5", "#00897b", "#f4511e", "#8e24aa", "#6d4c41"]  # one colour per request


@drawing("ch04_kvcache.page_table")
def page_table(data: dict) -> tuple[str, str]:
    reqs, num_slots = data["reqs"], data["num_slots"]
    cell, left, top = 26, 120, 34
    longest = max(len(r["slots"]) for r in reqs)
    per_row = 24
    pool_top = top + len(reqs) * (cell + 6) + 40
    width = max(left + longest * cell, left + per_row * cell) + 10
    height = pool_top + (num_slots // per_row + 1) * (cell + 16) + 30
    body = [text(left - 10, top - 10, "position", 11, "end")]
    body += [text(left + i * cell + cell / 2, top - 10, i, 10, "middle") for i in range(longest)]
    owner: dict[int, tuple[int, bool]] = {}  # slot -> (request, is cached)
    for row, req in enumerate(reqs):
        y = top + row * (cell + 6)
        body.append(text(left - 10, y + 17, f"row {row} ({req['name']})", 12, "end"))
        for pos, slot in enumerate(req["slots"]):
            cached = pos < req["cached_len"]
            owner[slot] = (row, cached)
            color = OWNERS[row % len(OWNERS)]
            body.append(
                rect(
                    left + pos * cell,
                    y,
                    cell,
                    cell,
                    COLORS["cached"] if cached else color,
                    f"{req['name']}, position {pos} -> slot {slot}",
                )
            )
            body.append(
                text(
                    left + pos * cell + cell / 2,
                    y + 17,
                    slot,
                    11,
                    "middle",
                    fill=COLORS["text"] if cached else "#ffffff",
                )
            )
    body.append(text(left - 10, pool_top - 12, "KV pool", 12, "end", "bold"))
    for slot in range(num_slots):
        x = left + (slot % per_row) * cell
        y = pool_top + (slot // per_row) * (cell + 16)
        row_cached = owner.get(slot)
        color = (
            COLORS["pad"]
            if row_cached is None
            else COLORS["cached"]
            if row_cached[1]
            else OWNERS[row_cached[0] % len(OWNERS)]
        )
        body.append(rect(x, y, cell, cell, color, f"slot {slot}"))
        body.append(text(x + cell / 2, y + cell + 11, slot, 9, "middle"))
        if row_cached is not None:
            body.append(
                text(
                    x + cell / 2,
                    y + 17,
                    reqs[row_cached[0]]["name"],
                    11,
                    "middle",
                    fill=COLORS["text"] if row_cached[1] else "#ffffff",
                )
            )
    body += legend(
        left,
        height - 10,
        [
            (COLORS["cached"], "cached (positions < cached_len)"),
            (OWNERS[0], "computed by this forward (a colour per request)"),
            (COLORS["pad"], "free slot"),
        ],
    )
    caption = (
        "Each request's row of the page table lists the pool slot of every position; "
        "the slots are scattered over the pool, and a forward writes K/V only at the "
        "uncached positions' slots (out_loc)."
    )
    return svg(width, height, body, caption), caption


# --- chapter 5: the gather and the mask of the torch backend ----------------------------------


@drawing("ch05_attention.gather_mask")
def gather_mask(data: dict) -> tuple[str, str]:
    ledgers, kv_indices, masks = data["ledgers"], data["kv_indices"], data["mask"]
    cell, gap, top = 9, 40, 96
    max_seq, max_extend = len(kv_indices[0]), len(masks[0])
    block = max_seq * cell
    width = len(ledgers) * (block + gap) + 30
    height = top + max_extend * cell + 50
    body = []
    for i, ((seq_len, cached), slots, mask) in enumerate(zip(ledgers, kv_indices, masks)):
        x0 = 30 + i * (block + gap)
        body.append(
            text(x0, 14, f"request {i}: {seq_len} tokens, {cached} cached", 12, weight="bold")
        )
        body.append(text(x0 - 4, top - 50, "slot", 9, "end"))
        for key, slot in enumerate(slots):
            real = key < seq_len
            x = x0 + key * cell
            body.append(
                rect(
                    x,
                    top - 44,
                    cell,
                    10,
                    OWNERS[i] if real else COLORS["pad"],
                    f"key {key} reads slot {slot}" if real else "padding: slot 0",
                )
            )
            if real:
                body.append(
                    f'<text font-size="7" transform="translate({x + 7:g},{top - 48}) '
                    f'rotate(-90)" fill="{COLORS["text"]}">{slot}</text>'
                )
        body.append(text(x0 - 4, top - 6, "keys →", 9, "end"))
        for q, row in enumerate(mask):
            real_query = q < seq_len - cached
            for key, allowed in enumerate(row):
                if key >= seq_len or not real_query:
                    color = COLORS["pad"]
                else:
                    color = OWNERS[i] if allowed else "#ffffff"
                body.append(
                    f'<rect x="{x0 + key * cell}" y="{top + q * cell}" width="{cell}" '
                    f'height="{cell}" fill="{color}" stroke="#e0e0e0" '
                    'stroke-width="0.5"/>'
                )
        body.append(line(x0, top, x0 + block, top))
    body.append(
        f'<text font-size="9" transform="translate(20,{top + 60}) rotate(-90)" '
        f'fill="{COLORS["text"]}">queries ↓</text>'
    )
    body += legend(
        30,
        height - 12,
        [
            (OWNERS[0], "attends"),
            ("#ffffff", "masked (a later position)"),
            (COLORS["pad"], "padding (hidden, never read)"),
        ],
    )
    caption = (
        "One prefill batch of the torch backend: each request's slots gathered from its "
        "page-table row into a padded block of keys (top, the slot each key reads), and "
        "the mask (below): query i of a request sits at position cached_len + i and sees "
        "every key up to it."
    )
    return svg(width, height, body, caption), caption


# --- chapter 9: the radix tree before and after a split ---------------------------------------


def edge_label(node: dict, chars: int = 24) -> str:
    """An edge's text on one line, shortened in the middle."""
    flat = node["text"].replace("\n", "⏎")
    if len(flat) > chars:
        flat = flat[: chars // 2 - 1] + "…" + flat[-(chars // 2 - 1) :]
    return f"{flat}  ({node['tokens']})"


ROOT_BOX = 48  # the root has no edge text: a narrow box


def draw_tree(
    root: dict, x0: float, y0: float, box: float, step: float, row: float
) -> tuple[list[str], float]:
    """A tree laid out left to right: depth gives x, leaves are stacked in y."""
    body: list[str] = []
    next_y = [y0]

    def place(node: dict, depth: int) -> float:
        x = x0 if depth == 0 else x0 + ROOT_BOX + (depth - 1) * step + (step - box)
        width = ROOT_BOX - (step - box) if depth == 0 else box
        if node["children"]:
            ys = [place(child, depth + 1) for child in node["children"]]
            y = (ys[0] + ys[-1]) / 2
            for child_y in ys:
                body.append(line(x + width, y + 11, x + width + step - box, child_y + 11))
        else:
            y = next_y[0]
            next_y[0] += row
        label = "root" if depth == 0 else edge_label(node)
        body.append(
            rect(x, y, width, 22, COLORS["decode"] if depth else COLORS["pad"], node["text"])
        )
        body.append(text(x + 4, y + 15, label, 11))
        return y

    place(root, 0)
    return body, next_y[0]


@drawing("ch09_radix.tree")
def radix_tree(data: dict) -> tuple[str, str]:
    box, step, row = 150, 166, 30
    body = [text(10, 16, "after the first request", 12, weight="bold")]
    before, bottom = draw_tree(data["before"], 10, 28, box, step, row)
    body += before
    mid = bottom + 24
    body.append(
        text(
            10,
            mid,
            "after the next three (the first edge split at the shared prefix)",
            12,
            weight="bold",
        )
    )
    after, bottom = draw_tree(data["after"], 10, mid + 12, box, step, row)
    body += after

    def depth(node: dict) -> int:
        return 1 + max((depth(c) for c in node["children"]), default=0)

    width = 10 + ROOT_BOX + (max(depth(data["before"]), depth(data["after"])) - 1) * step
    caption = (
        "The radix tree of the real run, each edge with its text and token count "
        "(⏎ is a newline). Inserting the second prompt split the first request's edge "
        "where the prompts diverge; a finished request's outputs stay cached too."
    )
    return svg(int(width), int(bottom + 10), body, caption), caption


# --- chapter 11: the step timeline without and with overlap -----------------------------------


@drawing("ch11_overlap.timeline")
def overlap_timeline(data: dict) -> tuple[str, str]:
    unit, lane, left = 14, 30, 150
    off, on = data["off"], data["on"]
    width = left + 2 * len(off) * unit + 20
    body: list[str] = []

    def batch(x: float, y: float, step: list, kind: str, dropped: int = 0) -> None:
        phase, reqs, tokens = step
        body.append(
            rect(
                x,
                y,
                unit,
                lane - 6,
                COLORS[phase] if kind == "forward" else COLORS["pad"],
                f"{phase} of {reqs} requests, {tokens} tokens",
            )
        )
        if dropped:
            body.append(
                rect(
                    x,
                    y,
                    unit,
                    (lane - 6) * dropped / reqs,
                    COLORS["dropped"],
                    f"{dropped} row(s) computed for requests that had already finished",
                )
            )
        body.append(
            text(
                x + unit / 2,
                y + 16,
                reqs,
                9,
                "middle",
                fill="#ffffff" if kind == "forward" and phase == "prefill" else COLORS["text"],
            )
        )

    rows = [("overlap off", 20), ("overlap on", 20 + 3 * lane + 20)]
    for (title, y), steps in zip(rows, (off, on)):
        body.append(text(10, y + 8, title, 12, weight="bold"))
        body += [
            text(left - 8, y + 16 + lane, "device: forward", 11, "end"),
            text(left - 8, y + 16 + 2 * lane, "CPU: results of", 11, "end"),
        ]
    for i, step in enumerate(off):  # each step waits for its own results
        batch(left + 2 * i * unit, rows[0][1] + lane, step, "forward")
        batch(left + (2 * i + 1) * unit, rows[0][1] + 2 * lane, step, "results")
    for i, step in enumerate(on):  # step i's forward runs while step i-1's results are read
        kept = off[i][1] if i < len(off) else 0
        batch(left + i * unit, rows[1][1] + lane, step, "forward", max(0, step[1] - kept))
        if i:
            batch(left + i * unit, rows[1][1] + 2 * lane, on[i - 1], "results")
    height = rows[1][1] + 3 * lane + 30
    body += legend(
        left,
        height - 8,
        [
            (COLORS["prefill"], "prefill"),
            (COLORS["decode"], "decode"),
            (COLORS["dropped"], "rows of finished requests, dropped"),
        ],
    )
    caption = (
        "The batches of the real runs (number = requests in the batch), one box per "
        "scheduler step, not to scale in time. Without overlap the CPU reads a batch's "
        "tokens before it schedules the next; with overlap it reads batch N while the "
        "device computes N+1, so a request that just finished is computed once more."
    )
    return svg(width, height, body, caption), caption


# --- chapter 8 (from chapter 9's run): cache_req's four regions of a row ----------------------


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@drawing("ch09_radix.regions")
def cache_req_regions(data: dict) -> tuple[str, str]:
    page, old, rows = data["page_size"], data["old"], data["rows"]
    (first, first_row), (second, second_row) = rows.items()
    length = len(first_row)
    new = length // page * page  # what an insert can hold: whole pages
    shared = min(common_prefix(first_row, second_row), new)  # the second found these cached
    regions = {
        first: [(0, old, "matched"), (old, new, "inserted"), (new, length, "tail")],
        second: [
            (0, old, "matched"),
            (old, shared, "duplicate"),
            (shared, new, "inserted"),
            (new, length, "tail"),
        ],
    }
    colors = {
        "matched": COLORS["cached"],
        "inserted": COLORS["new"],
        "duplicate": COLORS["dropped"],
        "tail": COLORS["waiting"],
    }
    cell, left, top = 34, 130, 40
    width, height = left + length * cell + 20, top + 2 * 64 + 62
    body = [text(left - 10, top - 14, "position", 11, "end")]
    body += [text(left + i * cell + cell / 2, top - 14, i, 11, "middle") for i in range(length)]
    for r, (name, row) in enumerate(rows.items()):
        y = top + r * 64
        body.append(text(left - 10, y + 21, f"{name}'s row", 12, "end", "bold"))
        for start, end, kind in regions[name]:
            for pos in range(start, end):
                body.append(
                    rect(
                        left + pos * cell,
                        y,
                        cell,
                        32,
                        colors[kind],
                        f"{name}, position {pos}: slot {row[pos]} ({kind})",
                    )
                )
                body.append(
                    text(
                        left + pos * cell + cell / 2,
                        y + 21,
                        row[pos],
                        11,
                        "middle",
                        fill="#ffffff" if kind == "inserted" else COLORS["text"],
                    )
                )
            if end > start:
                body.append(text(left + start * cell + 2, y + 46, f"[{start}, {end})", 10))
        for boundary in range(0, length + 1, page):  # page boundaries
            body.append(
                line(left + boundary * cell, y - 4, left + boundary * cell, y + 36, dash=True)
            )
    body += legend(
        left,
        height - 28,
        [
            (COLORS["cached"], "[0, old): matched at admission"),
            (COLORS["new"], "[shared, new): inserted"),
        ],
    )
    body += legend(left + 330, height - 28, [(COLORS["waiting"], "[new, cached_len): tail")])
    body += legend(
        left,
        height - 8,
        [
            (
                COLORS["dropped"],
                "[old, shared): duplicates, freed; the row now reads the cache's slots",
            )
        ],
    )
    caption = (
        f"cache_req after one prefill of two requests with the same {length}-token prompt, "
        f"page size {page}, when the cache held the first {old} tokens: each row after its "
        f"cache_req, slot numbers in the cells, page boundaries dashed. {second}'s "
        f"positions {old} to {shared - 1} now point at {first}'s slots."
    )
    return svg(width, height, body, caption), caption


# --- chapters 16, 20, 21: measured figures from benchmark/results/, as bars -----------------


@drawing("ch16_tp.h200")
@drawing("ch20_moe.h200")
@drawing("ch21_benchmark.h200")
def measured_bars(data: dict) -> tuple[str, str]:
    """One bar per measurement, the peer's (transformers, torch code) in a second color; a
    row's optional note (how many runs, their range) follows its value."""
    left, bar, gap, scale_width = 230, 22, 8, 400
    notes = any(row.get("note") for row in data["bars"])
    largest = max(row["value"] for row in data["bars"])
    height = 20 + len(data["bars"]) * (bar + gap)
    body: list[str] = []
    for i, row in enumerate(data["bars"]):
        y = 10 + i * (bar + gap)
        color = COLORS["waiting"] if row["peer"] else COLORS["prefill"]
        length = max(1.0, scale_width * row["value"] / largest)
        value = f"{row['value']:,.{0 if row['value'] >= 100 else 2}f} {data['unit']}"
        if row.get("note"):
            value += f" ({row['note']})"
        body += [
            text(left - 8, y + 15, row["label"], 12, "end"),
            rect(left, y, length, bar, color, value),
            text(left + length + 6, y + 15, value, 11),
        ]
    width = left + scale_width + (330 if notes else 130)
    return svg(width, height, body, data["caption"]), data["caption"]


# --- chapter 17: a batch in FlashInfer's CSR form ---------------------------------------------


@drawing("ch17_gpu_attention.page_lists")
def flashinfer_page_lists(data: dict) -> tuple[str, str]:
    page_size, reqs = data["page_size"], data["reqs"]
    kv_indptr, kv_indices = data["kv_indptr"], data["kv_indices"]
    qo_indptr, last_page_len = data["qo_indptr"], data["last_page_len"]
    slot, left, top = 16, 150, 30
    page_w = page_size * slot + 8
    body = [text(left, top - 12, "each request's pages (a cell per slot)", 11, weight="bold")]
    for r, req in enumerate(reqs):
        y = top + r * 34
        pages = kv_indices[kv_indptr[r] : kv_indptr[r + 1]]
        body.append(text(left - 10, y + 16, f"{req['name']}: {req['tokens']} tokens", 12, "end"))
        for k, page in enumerate(pages):
            x = left + k * page_w
            for s in range(page_size):
                pos = k * page_size + s
                color = (
                    COLORS["pad"]
                    if pos >= req["tokens"]
                    else COLORS["cached"]
                    if pos < req["cached"]
                    else OWNERS[r % len(OWNERS)]
                )
                body.append(rect(x + s * slot, y, slot, 22, color, f"position {pos}"))
            body.append(text(x + page_size * slot / 2, y - 2, f"page {page}", 9, "middle"))
        used = last_page_len[r]
        body.append(text(left + len(pages) * page_w + 4, y + 16, f"last_page_len {used}", 10))
    y = top + len(reqs) * 34 + 30
    body.append(text(left - 10, y + 16, "kv_indices", 12, "end", "bold"))
    for i, page in enumerate(kv_indices):
        owner = next(r for r in range(len(reqs)) if kv_indptr[r] <= i < kv_indptr[r + 1])
        body.append(rect(left + i * 34, y, 34, 22, OWNERS[owner % len(OWNERS)], f"entry {i}"))
        body.append(text(left + i * 34 + 17, y + 15, page, 11, "middle", fill="#ffffff"))
    for ptr in kv_indptr:
        body.append(line(left + ptr * 34, y - 6, left + ptr * 34, y + 28))
        body.append(text(left + ptr * 34, y + 40, ptr, 10, "middle"))
    body.append(text(left - 10, y + 40, "kv_indptr", 11, "end"))
    y += 64
    body.append(text(left - 10, y + 16, "new tokens", 12, "end", "bold"))
    cell = 14
    for r in range(len(reqs)):
        for t in range(qo_indptr[r], qo_indptr[r + 1]):
            body.append(rect(left + t * cell, y, cell, 22, OWNERS[r % len(OWNERS)], f"token {t}"))
    for ptr in qo_indptr:
        body.append(line(left + ptr * cell, y - 6, left + ptr * cell, y + 28))
        body.append(text(left + ptr * cell, y + 40, ptr, 10, "middle"))
    body.append(text(left - 10, y + 40, "qo_indptr", 11, "end"))
    width = left + max(len(kv_indices) * 34, qo_indptr[-1] * cell, 4 * page_w + 110) + 20
    height = y + 70
    body += legend(
        left,
        height - 10,
        [
            (COLORS["cached"], "cached"),
            (OWNERS[0], "computed now (a colour per request)"),
            (COLORS["pad"], "unused slot"),
        ],
    )
    caption = (
        f"The batch of chapter 17's main, page size {page_size}: each request's pages "
        "(top), their concatenation kv_indices with kv_indptr marking where each request's "
        "pages start, and the batch's new tokens split by qo_indptr. last_page_len counts "
        "the slots in use in each last page, from 1 to the page size."
    )
    return svg(width, height, body, caption), caption


# --- chapter 18: the graph ladder and the padding of each batch size --------------------------


@drawing("ch18_cuda_graph.ladder")
def graph_ladder(data: dict) -> tuple[str, str]:
    ladder, replays = data["ladder"], data["replays"]
    top_size = ladder[-1]
    col, scale, left, top = 9, 3, 40, 20
    base = top + top_size * scale
    replayed = {batch for batch, _ in replays}
    body = [text(left - 6, base + 4, 0, 9, "end"), text(left - 6, top + 4, top_size, 9, "end")]
    for n in range(1, top_size + 1):
        graph = min(s for s in ladder if s >= n)
        x = left + (n - 1) * col
        body.append(rect(x, base - n * scale, col, n * scale, OWNERS[0], f"batch {n}"))
        if graph > n:
            body.append(
                rect(
                    x,
                    base - graph * scale,
                    col,
                    (graph - n) * scale,
                    COLORS["waiting"],
                    f"batch {n} replays graph {graph}: {graph - n} padding rows",
                )
            )
        if n in ladder:
            body.append(text(x + col / 2, base + 14, n, 9, "middle"))
        if n in replayed:
            body.append(
                f'<circle cx="{x + col / 2:g}" cy="{base + 24:g}" r="3" fill="{COLORS["text"]}"/>'
            )
    body.append(line(left, base, left + top_size * col, base))
    body.append(
        text(
            left + top_size * col / 2,
            base + 44,
            "batch size (captured sizes labelled)",
            11,
            "middle",
        )
    )
    width, height = left + top_size * col + 20, base + 76
    body += legend(
        left,
        height - 8,
        [
            (OWNERS[0], "the batch's rows"),
            (COLORS["waiting"], "padding up to the graph replayed"),
            (COLORS["text"], "sizes the main's run replayed"),
        ],
    )
    caption = (
        f"The ladder of graphs up to {top_size} (1, 2, 4, then every 8): each batch size "
        "replays the smallest captured graph that holds it, so a bar is the batch's rows plus "
        "the padding rows computed for nothing; dots mark the decode batch sizes the main's "
        "run replayed."
    )
    return svg(width, height, body, caption), caption


# --- chapter 22: one request's split-KV chunks and their weights in the merge -----------------


@drawing("ch22_paged_attention.splits")
def split_kv_chunks(data: dict) -> tuple[str, str]:
    seq_len, bounds = data["seq_len"], data["bounds"]
    lse, weights = data["lse"], data["weights"]
    left, top, width, bar_h, weight_h = 20, 30, 640, 34, 90
    scale = width / seq_len
    title = f"one request's {seq_len} keys, cut into chunks"
    body = [text(left, top - 12, title, 11, weight="bold")]
    base = top + bar_h + 26 + weight_h
    for s, ((start, end), value, weight) in enumerate(zip(bounds, lse, weights)):
        x, w = left + start * scale, (end - start) * scale
        color = OWNERS[s % len(OWNERS)]
        body.append(rect(x, top, w, bar_h, color, f"split {s}: keys [{start}, {end})"))
        body.append(text(x + w / 2, top + 14, f"[{start}, {end})", 10, "middle", fill="#ffffff"))
        body.append(text(x + w / 2, top + 28, f"LSE {value:.2f}", 10, "middle", fill="#ffffff"))
        h = weight * weight_h
        body.append(rect(x + 2, base - h, max(w - 4, 2), h, color, f"weight {weight:.3f}"))
        body.append(text(x + w / 2, base - h - 4, f"{weight:.3f}", 10, "middle"))
    body.append(line(left, base, left + width, base))
    body.append(
        text(
            left + width / 2, base + 16, "weight of each chunk's output in the merge", 11, "middle"
        )
    )
    caption = (
        f"Split-KV for one request of chapter 22's main ({seq_len} keys, {len(bounds)} splits, "
        f"chunks rounded up to blocks of {data['block_n']} keys): each chunk's program writes "
        "its output over the chunk alone and the chunk's log-sum-exp (top); the merge weighs "
        "chunk s by exp(LSE_s - max LSE), normalised (bars), its share of the whole softmax. "
        "A short last chunk holds little of the mass."
    )
    # Room on the right for a short last chunk's label, centred on it.
    return svg(left + width + 60, base + 30, body, caption), caption


# --- chapter 25: how many tokens the grammar allows at each step ------------------------------


@drawing("ch25_structured.allowed")
def allowed_tokens(data: dict) -> tuple[str, str]:
    import math

    vocab, tokens, allowed = data["vocab"], data["tokens"], data["allowed"]
    col, height, left, top = 26, 150, 56, 14
    base = top + height

    # A log axis that starts at 1/2, not 1, so that a forced token's bar (1 allowed) has height.
    def bar_height(count: float) -> float:
        return math.log10(2 * count) / math.log10(2 * vocab) * height

    body = []
    for exponent in range(int(math.log10(vocab)) + 1):
        y = base - bar_height(10**exponent)
        body += [line(left - 4, y, left + len(tokens) * col, y, dash=True)]
        body.append(text(left - 8, y + 4, f"{10**exponent:,}", 9, "end"))
    for i, (piece, count) in enumerate(zip(tokens, allowed)):
        x = left + i * col
        h = bar_height(count)
        color = COLORS["dropped"] if count == 1 else (OWNERS[0] if count < 100 else OWNERS[1])
        body.append(rect(x + 2, base - h, col - 4, h, color, f"{piece!r}: {count:,} allowed"))
        body.append(text(x + col / 2, base + 14, piece.strip() or "␣", 9, "middle"))
    body.append(line(left, base, left + len(tokens) * col, base))
    width, total = left + len(tokens) * col + 10, base + 50
    body += legend(
        left,
        total - 8,
        [
            (COLORS["dropped"], "one token allowed (forced)"),
            (OWNERS[0], "under 100 allowed"),
            (OWNERS[1], "free text inside a string"),
        ],
    )
    forced = sum(1 for count in allowed if count == 1)
    caption = (
        f"The main's first JSON answer, token by token: how many of the {vocab:,} tokens the "
        "grammar allowed before each one (log scale from 1/2, so that a forced token's bar "
        f"reaches the line of 1). {forced} of its {len(tokens)} tokens "
        "were forced; the model chose freely only inside the name string, and among a handful "
        "of tokens everywhere else (digits in bounds, the enum's values, the next key)."
    )
    return svg(width, total, body, caption), caption


# --- chapter 23: mixed batches, and admission that preempts -----------------------------------


@drawing("ch23_mixed_batches.steps")
def mixed_steps(data: dict) -> tuple[str, str]:
    """Both runs of the long prompt, one block each: a lane per request (a cell where it got a
    token; the long prompt's chunk steps in the prefill colour), and each step's prompt tokens."""
    cell, lane, left = 30, 18, 150
    runs = [("prefill or decode", data["separate"]), ("mixed batches", data["mixed"])]
    width = left + cell * max(len(steps) for _, steps in runs) + 10
    body: list[str] = []
    y = 4
    for title, steps in runs:
        body.append(text(8, y + 14, title, 12, weight="bold"))
        y += 22
        for uid, name in ((0, "request 0"), (1, "request 1"), (2, "long prompt")):
            body.append(text(left - 8, y + 13, name, 11, "end"))
            for i, step in enumerate(steps):
                got = uid in step["tokens_to"]
                chunk = uid == 2 and i >= 1 and step["prompt_tokens"] and not got
                if got or chunk:
                    kind = "decode" if got else "prefill"
                    what = "a token" if got else f"a chunk ({step['prompt_tokens']} tokens)"
                    body.append(
                        rect(left + cell * i, y, cell, lane - 2, COLORS[kind], f"step {i}: {what}")
                    )
            y += lane
        body.append(text(left - 8, y + 12, "prompt tokens", 11, "end"))
        for i, step in enumerate(steps):
            body.append(
                text(left + cell * i + cell / 2, y + 12, step["prompt_tokens"], 10, "middle")
            )
        y += 24
    body += legend(left, y + 10, [(COLORS["decode"], "got a token"), (COLORS["prefill"], "chunk")])
    caption = (
        f"Two requests decode when a {data['long_prompt']}-token prompt arrives (budget "
        f"{data['budget']} tokens a step): each step of the two runs, who got a token, and the "
        "prompt tokens the step computed."
    )
    return svg(width, y + 20, body, caption), caption


@drawing("ch23_mixed_batches.admission")
def admission_preemption(data: dict) -> tuple[str, str]:
    """Both admissions on the same pool: per step, the pages in use and how many requests run,
    with the steps that preempted marked."""
    pages, per_page, cell = data["num_pages"], 1.5, 7
    runs = [("conservative", data["conservative"]), ("optimistic", data["optimistic"])]
    left, height_one = 110, pages * per_page + 40
    width = left + cell * max(len(steps) for _, steps in runs) + 20
    body: list[str] = []
    for row, (name, steps) in enumerate(runs):
        top = 10 + row * height_one
        bottom = top + pages * per_page
        body += [
            text(left - 8, top + 12, name, 12, "end", "bold"),
            text(left - 8, bottom, f"{pages} pages", 10, "end"),
        ]
        before = 0
        for i, step in enumerate(steps):
            used = pages - step["free"]
            x = left + cell * i
            tip = f"step {i}: {used} pages in use, {len(step['running'])} running"
            body.append(
                rect(x, bottom - used * per_page, cell, used * per_page, COLORS["used"], tip)
            )
            if step["preemptions"] > before:
                body.append(rect(x, top - 6, cell, 6, COLORS["dropped"], f"step {i}: preempted"))
            before = step["preemptions"]
            body.append(rect(x, bottom + 4, cell, 3 * len(step["running"]), COLORS["decode"], tip))
        body.append(line(left, bottom, width - 10, bottom))
    body += legend(
        left,
        10 + 2 * height_one,
        [
            (COLORS["used"], "pages in use"),
            (COLORS["decode"], "requests running (bar under the axis)"),
            (COLORS["dropped"], "a preemption"),
        ],
    )
    caption = (
        f"Eight requests on {pages} one-token pages, each step of the two runs: the pages in use, "
        "how many requests run (under the axis), and where optimistic admission preempted."
    )
    return svg(width, 30 + 2 * height_one, body, caption), caption


# --- chapter 24: drafts, accepted drafts and the ledger through each verify step --------------


@drawing("ch24_speculative.steps")
def speculative_steps(data: dict) -> tuple[str, str]:
    """One block per request: a column per decode step, its k drafts stacked (accepted at the
    bottom, then the model's own token, then the rejected ones), and under it the sequence's
    length before and after the step."""
    k = data["k"]
    cell, unit, left, gap = 22, 12, 70, 46
    runs = [(name, data[name]) for name in ("copy", "free")]
    width = left + cell * max(len(run["steps"]) for _, run in runs) + 20
    body: list[str] = []
    y = 20
    for name, run in runs:
        steps = run["steps"]
        accepted = sum(s["accepted"] for s in steps)
        drafted = sum(s["drafted"] for s in steps)
        title = f"{name} request: {accepted} of {drafted} drafts accepted in {len(steps)} steps"
        body.append(text(left, y, title, 11, weight="bold"))
        base = y + 10 + (k + 1) * unit
        for i, s in enumerate(steps):
            x = left + i * cell
            # accepted drafts, then the model's own token (none if EOS came inside the run)
            taken = min(s["accepted"], s["emitted"])
            rejected = s["drafted"] - taken
            parts = [
                (taken, OWNERS[1], "accepted drafts"),
                (s["emitted"] - taken, OWNERS[0], "the model's own token"),
                (rejected, COLORS["dropped"], "rejected drafts, rolled back"),
            ]
            top = base
            for count, color, what in parts:
                if count <= 0:
                    continue
                top -= count * unit
                tip = (
                    f"step {i}: {what}: {count}; ledger {s['before']} -> verified "
                    f"{s['verified']} -> {s['after']}"
                )
                body.append(rect(x + 2, top, cell - 4, count * unit, color, tip))
            body.append(text(x + cell / 2, base + 12, s["after"][1], 8, "middle"))
        body.append(line(left, base, left + len(steps) * cell, base))
        body.append(text(left - 8, base - 2, "tokens", 9, "end"))
        body.append(text(left - 8, base + 12, "length", 9, "end"))
        y = base + gap
    body += legend(
        left,
        y - 10,
        [
            (OWNERS[1], "accepted drafts"),
            (OWNERS[0], "the model's own token"),
            (COLORS["dropped"], "rejected drafts (rolled back)"),
        ],
    )
    caption = (
        f"Each decode step of the main's two requests with k = {k} drafts: a column is the "
        "k + 1 tokens one forward verified. The drafts the model agreed with (bottom) and its "
        "own next token are kept; the rest were computed and rolled back. Under each column, "
        "the sequence's length (device_len) after the step."
    )
    return svg(width, y + 10, body, caption), caption
