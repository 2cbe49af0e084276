"""The stall verdict, as a pure function: every rank's view in, one verdict out.

:func:`judge` takes one *view* per rank (plain data, as the ranks published
it through the store or as the others saw a rank that could not publish) and
returns the verdict as plain data; :func:`render` prints it in 80 columns.
The stall watch (:mod:`commrt.diagnosis.stall`) calls both on one rank, the
judge, and every rank prints the judge's text, so the verdict is the same
everywhere; ``commrt diagnose`` calls them on the dumped files.

A view is a dict:

* ``rank``, ``host``, ``pid``;
* ``state``: ``"published"`` (it answered), ``"dead"`` (process gone, no
  heartbeat), ``"stopped"`` (SIGSTOP: alive, not scheduled), ``"lost"`` (no
  heartbeat, on another host: dead or stopped, unknown), ``"silent"``
  (alive, did not answer: where its last heartbeat had it waiting on a peer
  in the others' call, the chain goes on through it, and it is a root only
  where the chain leads back to it), ``"dropped"`` (backup workers dropped it: not a
  hang); ``"left"`` (it ended after a call of its own failed, a peer's
  connection closing under it, and said so in its farewell: never a root
  cause; the chain of waits goes on through its last heartbeat's position);
* ``position``: :meth:`commrt.schedule.position.Position.describe` plus
  ``seq`` (collective calls begun) and ``sync_step``;
* ``idle_s``: seconds since its last progress (for a rank that did not
  answer: since its last heartbeat);
* ``stack``: its main thread's frames, outermost first, each
  ``[file, line, function, user]`` (``user``: not commrt, torch or the
  standard library);
* ``error``: the error it died of, if any (first line).

Root causes, in the order a tie is broken: dead, stopped, lost, silent, in
another collective, in user code; a dead rank is the root whoever waits on it. A rank in the collective most ranks are
in waits on a peer; the chain of waits is followed to a rank that is not
waiting in that collective: that rank is a root, and the ranks whose chains
end there are grouped under it.
"""

from __future__ import annotations

import textwrap
from collections import Counter

WIDTH = 80
#: root-cause kinds, most decisive first (a tie between roots goes to the first)
KINDS = ("dead", "stopped", "lost", "silent", "other collective", "user code")
#: what to do next, per kind
ADVICE = {
    "dead": "read rank {rank}'s own output for why it died (and the kernel log on "
    "{host}: `dmesg | grep -i oom` for the OOM killer); restart the job, or run with "
    "backup workers to survive a lost rank.",
    "stopped": "rank {rank} was stopped (a debugger, Ctrl-Z, a scheduler's suspend): "
    "`kill -CONT {pid}` on {host} resumes it.",
    "lost": "on {host}, `ps -o stat= -p {pid}` tells stopped (T) from dead (nothing); "
    "rank {rank}'s own output says why.",
    "silent": "rank {rank} is alive but did not answer (a C call holding the GIL, or "
    "swapping): `py-spy dump --pid {pid}` on {host} shows where it is.",
    "other collective": "make every rank call the same collectives in the same order; "
    "COMMRT_DEBUG=1 checks every call and names the first mismatch.",
    "user code": "look at what {where} does (I/O, a lock, a data loader, an uneven "
    "number of batches); `py-spy dump --pid {pid}` on {host} shows it live.",
    "cycle": "no rank holds the others: messages were lost or the ranks run different "
    "schedules; rerun with COMMRT_DEBUG=1 and check the network between the hosts.",
}


def judge(views: list[dict], stall_s: float | None = None) -> dict:
    """The verdict for ``views`` (one per rank, in rank order); see the module docs."""
    by_rank = {v["rank"]: v for v in views}
    calls = {r: _signature(v) for r, v in by_rank.items() if _in_call(v)}
    common = _majority(calls)
    terminal = {}  # rank -> kind, for every rank that is not waiting in the common call
    passing = {r for r, v in by_rank.items() if _waited_when_last_seen(v, common)}
    for r, v in sorted(by_rank.items()):
        kind = _kind(v, calls.get(r), common)
        if kind is not None and r not in passing:
            terminal[r] = kind
    roots, chains = _chains(calls, by_rank, terminal)
    looped = {
        next(r for r in c if r in passing)
        for c in chains.values()
        if c[-1] is None and passing.intersection(c)
    }
    if looped:  # a silent rank the others' waits lead back to holds them: it is a root
        terminal |= dict.fromkeys(looped, "silent")
        roots, chains = _chains(calls, by_rank, terminal)
    blamed = {r: k for r, k in terminal.items() if k not in ("dropped",)}
    blamed |= {r: "silent" for r in passing if r not in blamed}
    if not chains and not any(k in KINDS[:4] for k in blamed.values()):  # nobody waits
        return {"kind": "none", "root": None, "lines": ["commrt: no stall: every rank runs."]}
    root = _pick_root(blamed, roots, chains)
    verdict = {
        "kind": terminal.get(root, "cycle") if root is not None else "cycle",
        "root": root,
        "host": by_rank[root]["host"] if root is not None else None,
        "pid": by_rank[root].get("pid") if root is not None else None,
        # a rank that waits on all (a barrier) waits on the root too
        "waiting": sorted(roots.get(root, []) + _on_all(roots, by_rank))
        if root is not None
        else sorted(chains),
        "chain": _longest(chains, root),
        "others": {str(r): k for r, k in sorted(blamed.items()) if r != root},
        "dropped": sorted(r for r, k in terminal.items() if k == "dropped"),
        "left": sorted(r for r, v in by_rank.items() if v.get("state") == "left"),
        "stall_s": stall_s,
    }
    verdict["lines"] = _lines(verdict, by_rank, common)
    verdict["summary"] = _summary(verdict, by_rank, common)
    return verdict


def render(verdict: dict) -> str:
    """The verdict's text, each line at most :data:`WIDTH` columns."""
    return "\n".join(verdict["lines"])


def printer(verdict: dict, host: str) -> int | None:
    """The rank that prints the verdict in full on ``host``: the lowest that answered there
    (launchers merge a host's output: one block per host, not one per rank)."""
    here = [v for v in verdict.get("views", []) if v.get("host") == host]
    answered = [v["rank"] for v in here if v.get("state") == "published"]
    return min(answered or [v["rank"] for v in here], default=None)


def pointer(verdict: dict, rank: int, where: str) -> str:
    """What a rank prints where the verdict's full text is elsewhere (``where``: "rank 0
    prints it in full", or in the error this rank raises): one sentence, wrapped at
    :data:`WIDTH`, naming the root cause and where it is."""
    cause = verdict.get("summary") or _summary_of_lines(verdict["lines"])
    return "\n".join(wrap(f"commrt: rank {rank}: stall verdict ({where}): {cause}"))


# -- classifying ranks


def _in_call(view: dict) -> bool:
    return view.get("state") == "published" and bool(view.get("position", {}).get("in_call"))


def _signature(view: dict) -> tuple:
    p = view.get("position", {})
    return (p.get("kind"), p.get("algorithm"), p.get("numel"), p.get("dtype"), p.get("seq"))


def _majority(calls: dict) -> tuple | None:
    if not calls:
        return None
    counts = Counter(calls.values())
    best = max(counts.values())
    return next(calls[r] for r in sorted(calls) if counts[calls[r]] == best)


def _kind(view: dict, call: tuple | None, common: tuple | None) -> str | None:
    """The root-cause kind of a rank that does not wait in the common call, else None
    (a rank that ``left`` after its own call failed is no cause either)."""
    state = view.get("state")
    if state == "left":
        return None
    if state != "published":
        return state  # dead, stopped, silent, dropped
    if call is None:
        return "user code"
    return None if call == common else "other collective"


def _waited_when_last_seen(view: dict, common: tuple | None) -> bool:
    """Whether ``view`` is a rank that did not answer (``silent``: alive, perhaps merely
    slow to answer under load) whose last heartbeat had it waiting on a peer in the call
    the others are in: the chain of waits goes on through it, as through a rank that
    ``left``; it is a root only where the chain leads back to it."""
    p = view.get("position", {})
    return (
        view.get("state") == "silent"
        and bool(p.get("in_call"))
        and p.get("peer") is not None
        and common is not None
        and _signature(view) == common
    )


def _chains(calls: dict, by_rank: dict, terminal: dict) -> tuple[dict, dict]:
    """(roots, chains): each waiting rank's chain of waits (:func:`_follow`), and the
    waiting ranks grouped by the rank their chain ends at."""
    roots, chains = {}, {}
    for r in sorted(calls):
        if r in terminal:
            continue
        chain = _follow(r, by_rank, terminal)
        chains[r] = chain
        roots.setdefault(chain[-1], []).append(r)
    return roots, chains


def _follow(rank: int, by_rank: dict, terminal: dict) -> list[int]:
    """The chain of waits from ``rank``: peers followed until a terminal rank or a loop
    (then the chain ends where it loops back; its last rank is no root)."""
    chain, seen = [rank], {rank}
    while chain[-1] not in terminal:
        peer = by_rank[chain[-1]].get("position", {}).get("peer")
        if peer is None or peer not in by_rank or peer in seen:
            return chain + [None]
        chain.append(peer)
        seen.add(peer)
    return chain


def _on_all(roots: dict, by_rank: dict) -> list[int]:
    """The ranks whose chain ends in no peer: they wait on every rank (a barrier)."""
    return [r for r in roots.get(None, []) if by_rank[r]["position"].get("peer") is None]


def _pick_root(blamed: dict, roots: dict, chains: dict) -> int | None:
    """A dead rank, else the root with the most waiters; a tie goes to the most decisive
    kind, then the lowest rank. None where every chain loops (no rank holds the others).
    A death comes first whoever waits on it: the job cannot go on without that rank, and
    a survivor that was in its own code at the moment (its data loader) only seems to hold
    the ranks that wait on it."""
    real = [r for r in blamed if r is not None]
    if not real:
        return None
    return min(
        real, key=lambda r: (blamed[r] != "dead", -len(roots.get(r, [])), KINDS.index(blamed[r]), r)
    )


def _longest(chains: dict, root: int | None) -> list:
    ends = [c for c in chains.values() if c[-1] == root]
    return max(ends, key=len) if ends else []


# -- the text


def ranks_text(ranks) -> str:
    """``[0, 1, 2, 5]`` -> ``"ranks 0-2,5"``, ``[0, 1, 3]`` -> ``"ranks 0,1,3"``; one rank ->
    ``"rank 3"``."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs: list[list[int]] = []
    for r in ranks:
        if runs and runs[-1][-1] == r - 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    parts = [f"{x[0]}-{x[-1]}" if len(x) > 2 else ",".join(map(str, x)) for x in runs]
    return "ranks " + ",".join(parts)


def call_text(position: dict) -> str:
    """``all_reduce (ring, 2 × float32, call 7)``, plus the GradientSync step and bucket or
    the torch.distributed op where there is one."""
    p = position
    if p.get("kind") is None:
        return "no collective yet"
    extra = [f"{p.get('algorithm')}", f"{p.get('numel')} × {p.get('dtype')}"]
    extra = [] if p["kind"] == "barrier" else extra
    if p.get("sync_step") is not None:
        extra.append(f"GradientSync step{NBSP}{p['sync_step']}")
    if p.get("bucket") is not None:
        extra.append(f"bucket{NBSP}{p['bucket']}")
    if p.get("torch_op"):
        extra.append(f"torch {p['torch_op']}")
    extra.append(f"call{NBSP}{p.get('seq')}")  # a number stays with its word (wrap)
    return f"{p['kind']} ({', '.join(extra)})"


def where_text(view: dict, frames: int = 3) -> list[str]:
    """The innermost user frames of ``view``'s stack, ``file:line in function``, innermost
    first (all frames where none is user code); then the stack's innermost frame, where
    it is not one of those (where the thread is stuck: a lock, a socket, a sleep)."""
    stack = view.get("stack") or []
    user = [f for f in stack if len(f) > 3 and f[3]] or stack
    shown = [f"{f[0]}:{f[1]} in {f[2]}" for f in reversed(user[-frames:])]
    if stack and stack[-1] not in user[-frames:]:
        inner = stack[-1]
        shown.append(f"innermost: {inner[0]}:{inner[1]} in {inner[2]}")
    return shown


def _code_at(frame) -> str:
    """A user frame as the advice names it: its function, or its file and line where it
    has no name of its own (``<module>``, a ``<lambda>``, a comprehension)."""
    return f"{frame[0]}:{frame[1]}" if frame[2].startswith("<") else frame[2]


def _who(view: dict) -> str:
    return f"rank {view['rank']} (host {view.get('host')}, pid {view.get('pid')})"


def _cause(kind: str, view: dict, common: tuple | None, by_rank: dict) -> list[str]:
    """The root cause's lines: who, what, and where."""
    idle = view.get("idle_s")
    idle_txt = f"{idle:.0f} s" if isinstance(idle, (int, float)) else "a while"
    who = f"root cause: {_who(view)} is "
    if kind == "dead":
        return [who + "DEAD:", f"  its process is gone; last heartbeat {idle_txt} ago."]
    if kind == "stopped":
        return [who + "STOPPED (SIGSTOP):", "  alive but not scheduled."]
    if kind == "lost":
        return [who + "LOST: no heartbeat", f"  for {idle_txt} (dead or stopped, on another host)."]
    if kind == "silent":
        return [who + "NOT ANSWERING:", f"  alive; last heartbeat {idle_txt} ago."]
    if kind == "user code":
        head = [who + "IN USER CODE,", f"  in no collective for {idle_txt}, at:"]
        return head + ["    " + w for w in where_text(view)]
    if kind == "other collective":
        in_common = [
            r for r, v in sorted(by_rank.items()) if _in_call(v) and _signature(v) == common
        ]
        theirs = call_text(by_rank[in_common[0]]["position"]) if in_common else "another collective"
        mine = call_text(view.get("position", {}))
        others = ranks_text(in_common) if in_common else "the others"
        return [
            who + "IN ANOTHER COLLECTIVE:",
            f"  {mine} on rank {view['rank']},",
            f"  while {others} {'is' if len(in_common) == 1 else 'are'} in {theirs}.",
        ]
    return [who + kind.upper() + "."]


def _lines(verdict: dict, by_rank: dict, common: tuple | None) -> list[str]:
    root = verdict["root"]
    lines = ["commrt stall verdict (the same on every rank):"]
    if root is None:
        lines.append(
            f"no single root: {ranks_text(verdict['waiting'])} wait on each other in the "
            "same collective."
        )
        advice = ADVICE["cycle"]
    else:
        view = by_rank[root]
        lines += _cause(verdict["kind"], view, common, by_rank)
        user = [f for f in view.get("stack") or [] if len(f) > 3 and f[3]]
        advice = ADVICE[verdict["kind"]].format(
            rank=root,
            host=view.get("host"),
            pid=view.get("pid"),
            where=_code_at(user[-1]) if user else "that code",
        )
    if verdict["waiting"] and root is not None:
        sample = by_rank[verdict["waiting"][0]].get("position", {})
        lines.append(f"waiting for it: {ranks_text(verdict['waiting'])}, in")
        lines.append(f"  {call_text(sample)}")
        if len(verdict["chain"]) > 2:
            lines.append("chain of waits: " + " -> ".join(f"rank {r}" for r in verdict["chain"]))
    for r, kind in verdict["others"].items():
        lines.append(f"also: rank {r} is {kind}.")
    if verdict["left"]:
        lines.append(
            f"ended after a call failed under it (no cause): {ranks_text(verdict['left'])}."
        )
    if verdict["dropped"]:
        lines.append(f"dropped by backup workers (not a hang): {ranks_text(verdict['dropped'])}.")
    lines.append("next: " + advice)
    return [w for line in lines for w in wrap(line)]


def _summary(verdict: dict, by_rank: dict, common: tuple | None) -> str:
    """The root cause in one sentence, unwrapped (for :func:`pointer`)."""
    root = verdict["root"]
    if root is None:
        return _summary_of_lines(verdict["lines"])
    cause = _cause(verdict["kind"], by_rank[root], common, by_rank)
    head = cause[0].removeprefix("root cause: ").rstrip(":,")
    rest = [x.strip() for x in cause[1:]]
    if verdict["kind"] == "user code":  # "in no collective for N s, at:", then where
        return f"{head} at {rest[1]}." if len(rest) > 1 else head + "."
    return " ".join([head + (":" if rest else "."), *rest]).replace(NBSP, " ")


def _summary_of_lines(lines: list[str]) -> str:
    """The cause from a verdict's wrapped lines (one dumped before verdicts had a summary):
    its lines from the cause to the waiting ranks, joined."""
    body = []
    for line in lines[1:]:
        if line.startswith(("waiting for it:", "chain of waits:", "also:", "next:")):
            break
        body.append(line.strip())
    return " ".join(body).removeprefix("root cause: ") or "no single root."


def wrap(line: str) -> list[str]:
    """``line`` wrapped at :data:`WIDTH`, never inside a `quoted command` (printed without
    its quotes), at a no-break space (printed as a space) nor inside a word: a file's path
    longer than the width keeps a line of its own, whole, so that it can be copied."""
    if len(line.replace("`", "")) <= WIDTH:
        return [line.replace("`", "").replace(NBSP, " ")]
    parts = line.split("`")
    keep = "".join(p.replace(" ", NBSP) if i % 2 else p for i, p in enumerate(parts))
    lead = " " * (len(line) - len(line.lstrip()))  # kept on the first line too
    out = textwrap.wrap(
        keep.lstrip(),
        WIDTH,
        initial_indent=lead,
        subsequent_indent=lead + "    ",
        break_on_hyphens=False,
        break_long_words=False,
    )
    return [w.replace(NBSP, " ") for w in out]


NBSP = "\u00a0"
