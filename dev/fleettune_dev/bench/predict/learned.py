"""A learned predictor for tables of best configurations (`Learned`, ``learned``).

What it learns from: the training rows' problem descriptors and best configurations, one model
per group (a MIOpen solver, a kernel family); where the groups are GPUs (vLLM's tables), one
model for all of them, the GPU a feature. Training rows' times only widen the candidates; the
predicted row's ``best`` and ``times`` are never read.

The model: the descriptor as a vector (numeric fields as sign·log2(1+|x|) and the power of two
that divides them, standardised; string fields, the GPU and, where few, the shape family
one-hot), plus a context: the bests of the nearest smaller and larger tuned problem of the same
family and GPU (one-hot per parameter, with their log2 size ratios). A two-layer MLP (64 units)
feeds one softmax head per parameter (a parameter a configuration lacks is a value of its own)
and one over the group's distinct bests, the joint choice. Cross-entropy summed over the heads,
Adam, a fixed seed. Each epoch draws every row's context afresh (the nearest rows, farther
ones, or none and no family, as for a family never tuned), so the net learns how a best moves
with the size rather than copying it. Early stopping on held-out training rows, then a refit
on all of them for the epochs found best.

The decoding: the valid configurations of a group are finite and known, so rather than decoding
parameter by parameter under constraints (a sequence model's constrained beam search), every
candidate is scored: the distinct bests of the group's training rows (of the row's GPU), every
configuration a training row measured valid, and, for vLLM's fused-MoE parameters, vLLM's
tuning grid. A score is a weighted sum of the per-parameter heads' log-probabilities (a
factorised sequence model), the joint head's, and a vote: the log share of the candidate among
the k nearest training problems, by the standardised descriptor or by log2 sizes with problems
of another kind far away (the nearest-problem rule's distance). The weights, k and the distance
are chosen by exact match (then per-parameter accuracy) on held-out training rows: a tenth,
or in a group under 3,000 rows each fifth in turn; never the rows to predict. Ties go to the
smaller configuration key: the ranking is deterministic.

The cost, on one CPU thread: fitting is O(rows × epochs) small matrix products, about two
minutes for the 120k rows of a MIOpen perf-db, seconds for the vLLM tables; ranking a row is
a forward pass and a distance to each training row of its group (about 2 ms).
"""

from __future__ import annotations

import itertools
import json
import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from fleettune_dev.bench.predict.rows import Row, config_key, stable_hash

ABSENT = "<absent>"  # the value of a parameter a configuration does not have
# vLLM's benchmark_moe.py tuning grid, for groups whose parameters are exactly these.
VLLM_GRID: dict[str, tuple[int, ...]] = {
    "BLOCK_SIZE_M": (16, 32, 64, 128, 256), "BLOCK_SIZE_N": (32, 64, 128, 256), "BLOCK_SIZE_K": (64, 128, 256),
    "GROUP_SIZE_M": (1, 16, 32, 64), "num_warps": (4, 8), "num_stages": (2, 3, 4, 5),
}
# Weights of the (per-parameter, joint, vote) log-probabilities tried on the held-out slice,
# in order of preference on ties.
MIXES: tuple[tuple[float, float, float], ...] = ((1.0, 1.0, 0.0), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0),
                                                 (1.0, 1.0, 1.0), (1.0, 0.0, 1.0), (0.0, 1.0, 1.0), (0.5, 1.0, 0.5))
CROSS = 3000  # groups with fewer rows choose their mix by 5-fold cross-validation
FAMILIES = 256  # at most this many shape families are one-hot features
TWOS = 10  # the factor of two counted at most (2**10)
TRACE = 1e-3  # weight of the parts a mix leaves out, to order what it ties
KIND = 8.0  # the vote's distance between two values of a string field, in octaves of a size
FLOOR = math.log(1e-6)  # log-probability of a configuration the joint head or the vote never saw
DRAW = (0.25, 0.5, 0.25)  # how an epoch draws a context slot: none, the nearest, or a farther one
NO_CONTEXT = 0.15  # share of rows drawn with no context at all, as for a family never tuned


def _value(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _described(row: Row) -> dict[str, Any]:
    """The row's problem, and a convolution's output sizes where it names its input, filter,
    padding, stride and dilation but not its output (MIOpen's perf-db)."""
    p: dict[str, Any] = dict(row.problem)
    for a in ("d", "h", "w"):
        size, fil = p.get(f"in_{a}", ""), p.get(f"fil_{a}", "")
        pad, dil, stride = p.get(f"pad_{a}", 0), p.get(f"dilation_{a}", 1) or 1, p.get(f"conv_stride_{a}", 1) or 1
        if f"out_{a}" not in p and all(_is_number(v) for v in (size, fil, pad, dil, stride)):
            p[f"out_{a}"] = max(0, (size + 2 * pad - dil * (fil - 1) - 1) // stride + 1)
    return p


class _Encoder:
    """The problem descriptor as a vector; the training rows fix the layout."""

    def __init__(self, rows: Sequence[Row]) -> None:
        described = [_described(r) for r in rows]
        fields = sorted({f for d in described for f in d})
        self.numeric = [f for f in fields if all(_is_number(d.get(f, 0)) for d in described)]
        # How many times 2 divides an integer size: tiles that divide a size evenly run faster,
        # and a log scale cannot tell 96 from 100.
        self.twos = [f for f in self.numeric if len({d.get(f, 0) for d in described}) > 2
                     and all(float(d.get(f, 0)).is_integer() for d in described)]
        strings = {f: sorted({str(r.problem[f]) for r in rows if f in r.problem}) for f in fields
                   if f not in self.numeric}
        strings["<device>"] = sorted({r.device for r in rows})
        families = sorted({r.family for r in rows})
        # The shape family (one vLLM table) where families are few and each has several rows.
        if len(families) <= FAMILIES and len(rows) >= 4 * len(families):
            strings["<family>"] = families
        self.onehot = {(f, v): i for i, (f, v) in enumerate((f, v) for f, vs in strings.items() for v in vs)}
        raw = self._numbers(described)
        self.mean = raw.mean(axis=0)
        self.scale = np.where(raw.std(axis=0) > 1e-9, raw.std(axis=0), 1.0)
        self.dense = raw.shape[1]
        self.family = np.array([False] * self.dense + [f == "<family>" for f, _ in self.onehot])
        # Column weights of the vote's two distances (standardised; log2 sizes as they are and
        # another kind far away), both without the powers of two: 96 and 128 are near sizes.
        numeric, ones, twos = len(self.numeric), np.ones(len(self.onehot)), np.zeros(self.dense - len(self.numeric))
        self.spaces = (np.concatenate([np.ones(numeric), twos, ones]),
                       np.concatenate([self.scale[:numeric], twos, KIND * ones]))

    def _numbers(self, described: Sequence[dict[str, Any]]) -> np.ndarray:
        n = len(described)
        x = np.array([[float(v) if _is_number(v := d.get(f, 0)) else 0.0 for f in self.numeric] for d in described],
                     dtype=np.float64).reshape(n, len(self.numeric))
        ints = np.array([[abs(int(d.get(f, 0))) for f in self.twos] for d in described],
                        dtype=np.int64).reshape(n, len(self.twos))
        twos = np.log2((ints & -ints).clip(min=1)).clip(max=TWOS) * (ints > 0)
        return np.concatenate([np.sign(x) * np.log2(1.0 + np.abs(x)), twos], axis=1)

    def __call__(self, rows: Sequence[Row]) -> np.ndarray:
        out = np.zeros((len(rows), self.dense + len(self.onehot)), dtype=np.float32)
        out[:, :self.dense] = (self._numbers([_described(r) for r in rows]) - self.mean) / self.scale
        for i, r in enumerate(rows):
            for f, v in [*r.problem.items(), ("<device>", r.device), ("<family>", r.family)]:
                j = self.onehot.get((f, str(v)))
                if j is not None:
                    out[i, self.dense + j] = 1.0
        return out


class _Context:
    """The bests of each row's nearest smaller and larger tuned problem of the same family."""

    def __init__(self, rows: Sequence[Row], onehot: np.ndarray) -> None:
        self.onehot = onehot  # (rows, values): the row's best, one-hot per parameter
        self.size = np.log2(np.maximum([r.volume for r in rows], 1e-9))
        by: dict[tuple[str, str], list[int]] = {}
        for i, r in enumerate(rows):
            by.setdefault((r.family, r.device), []).append(i)
        self.family = {f: sorted(idx, key=lambda i: (self.size[i], rows[i].key)) for f, idx in by.items()}
        # Each row's family as a slice of ``flat`` (its rows by size): where it starts, its length,
        # and the row's place in it, for drawing every row's slots at once.
        self.flat = np.array([i for idx in self.family.values() for i in idx], dtype=np.int64)
        self.start, self.pos, self.length = (np.zeros(len(rows), np.int64) for _ in range(3))
        at = 0
        for idx in self.family.values():
            self.start[idx], self.pos[idx], self.length[idx] = at, np.arange(len(idx)), len(idx)
            at += len(idx)
        self.width = 2 * (onehot.shape[1] + 2)

    def features(self, size: np.ndarray, below: np.ndarray, above: np.ndarray) -> np.ndarray:
        """Context features of problems of log2 ``size`` given their slots' rows (-1: none)."""
        parts = []
        for slot in (below, above):
            has = slot >= 0
            ratio = np.where(has, size - self.size[np.maximum(slot, 0)], 0.0) / 4.0
            parts += [self.onehot[np.maximum(slot, 0)] * has[:, None], has[:, None], ratio[:, None]]
        return np.concatenate(parts, axis=1).astype(np.float32)

    def nearest(self, row: Row) -> tuple[int, int]:
        """The nearest smaller and larger training row of ``row``'s family (-1: none)."""
        idx = self.family.get((row.family, row.device), [])
        size = math.log2(max(row.volume, 1e-9))
        at = bisect_left([self.size[i] for i in idx], size)
        above = next((i for i in idx[at:] if self.size[i] > size), -1)
        return (idx[at - 1] if at > 0 else -1), above

    def draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every training row's slots for one epoch: by DRAW, among the other rows of its family;
        and the rows drawn as if their family were never tuned (no slot)."""
        n = len(self.size)
        if not n:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool)
        start, pos, m = self.start, self.pos, self.length
        u, kind_b, kind_a = rng.random(n), rng.random(n), rng.random(n)
        near = DRAW[0] + DRAW[1]
        pick_b = np.where(kind_b < near, pos - 1, (u * np.maximum(pos - 1, 0)).astype(np.int64))
        below = np.where((pos > 0) & (kind_b >= DRAW[0]), self.flat[start + np.clip(pick_b, 0, m - 1)], -1)
        far_a = pos + 2 + (u * np.maximum(m - pos - 2, 0)).astype(np.int64)
        pick_a = np.where(kind_a < near, pos + 1, far_a)
        above = np.where((pos < m - 1) & (kind_a >= DRAW[0]), self.flat[start + np.clip(pick_a, 0, m - 1)], -1)
        none = rng.random(n) < NO_CONTEXT
        return np.where(none, -1, below), np.where(none, -1, above), none


class _Net(torch.nn.Module):
    """A two-layer trunk and every softmax head in one output layer (one matrix product)."""

    def __init__(self, width: int, hidden: int, heads: Sequence[int]) -> None:
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.ReLU(),
                                         torch.nn.Linear(hidden, hidden), torch.nn.ReLU())
        self.out = torch.nn.Linear(hidden, sum(heads))
        self.bounds = list(itertools.pairwise(itertools.accumulate(heads, initial=0)))

    def logprobs(self, x: np.ndarray) -> list[np.ndarray]:
        with torch.no_grad():
            z = self.out(self.trunk(torch.from_numpy(x)))
            return [torch.log_softmax(z[:, a:b], dim=1).numpy().astype(np.float64) for a, b in self.bounds]

    def loss(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        z = self.out(self.trunk(x))
        return sum((torch.nn.functional.cross_entropy(z[:, a:b], t[:, j]) for j, (a, b) in enumerate(self.bounds)),
                   torch.zeros(()))


@dataclass
class _Group:
    """One group's model, its candidates, and what the context and the vote look at."""

    encoder: _Encoder
    context: _Context
    candidates: list[dict[str, Any]]
    keys: list[str]  # the candidates' configuration keys
    codes: np.ndarray  # (candidates, params): each candidate's value index per parameter
    joint: np.ndarray  # (candidates,): its class in the joint head, -1 if no training row had it as best
    x: np.ndarray  # (train rows, descriptor width) descriptors, for the vote
    y: np.ndarray  # (train rows,) joint class of each training row's best
    net: _Net | None = None
    mix: tuple[float, float, float] = MIXES[0]
    k: int = 1  # neighbours of the vote
    allowed: dict[str, np.ndarray] = field(default_factory=dict)  # device -> its valid candidates
    space: int = 0  # the vote's distance, an index into the encoder's spaces
    voters: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # space -> rows, squared norms


class Learned:
    """A small MLP per group over the problem and its nearest tuned sizes' bests, and a vote of
    the nearest problems, scoring every valid candidate (see the module's docstring)."""

    name = "learned"

    def __init__(self, hidden: int = 64, epochs: int = 60, patience: int = 6, batch: int = 256,
                 neighbours: tuple[int, ...] = (1, 4, 16), seed: int = 0, threads: int | None = 1,
                 max_steps: int = 4000, pool: bool = True,
                 mixes: tuple[tuple[float, float, float], ...] = MIXES) -> None:
        self.hidden, self.epochs, self.patience, self.batch, self.max_steps = hidden, epochs, patience, batch, max_steps
        self.neighbours, self.seed, self.threads, self.mixes, self.pool = neighbours, seed, threads, mixes, pool
        self._groups: dict[str, _Group] = {}
        self._fallback: dict[tuple[str, ...], str] = {}

    def fit(self, train: Sequence[Row]) -> None:
        before = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            by: dict[str, list[Row]] = {}
            for r in train:
                by.setdefault(self._model(r), []).append(r)
            self._groups = {g: self._fit_group(g, rows) for g, rows in sorted(by.items())}
            # A group never seen: the largest group whose problems have the same fields.
            self._fallback = {}
            for g, rows in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0])):
                self._fallback.setdefault(tuple(sorted(rows[0].problem)), g)
        finally:
            torch.set_num_threads(before)

    def _fit_group(self, group: str, rows: list[Row]) -> _Group:
        cands = _candidates(rows)
        keys = sorted(cands)
        devices = sorted({r.device for r in rows})
        allowed = {d: np.isin(keys, sorted(_candidates([r for r in rows if r.device == d]))) for d in devices
                   if len(devices) > 1}
        params = sorted({p for c in cands.values() for p in c})
        values = [sorted({_value(c[p]) if p in c else ABSENT for c in cands.values()}) for p in params]
        index = [{v: i for i, v in enumerate(vs)} for vs in values]
        codes = np.array([[index[j][_value(cands[k][p]) if p in cands[k] else ABSENT] for j, p in enumerate(params)]
                          for k in keys], dtype=np.int64).reshape(len(keys), len(params))
        best_keys = sorted({config_key(r.best) for r in rows})
        joint_of, cand_of = {k: i for i, k in enumerate(best_keys)}, {k: i for i, k in enumerate(keys)}
        y_codes = codes[[cand_of[config_key(r.best)] for r in rows]]
        y = np.array([joint_of[config_key(r.best)] for r in rows], dtype=np.int64)
        offsets = np.cumsum([0, *map(len, values)])[:-1]
        onehot = np.zeros((len(rows), sum(map(len, values))), dtype=np.float32)
        for j in range(len(params)):
            onehot[np.arange(len(rows)), offsets[j] + y_codes[:, j]] = 1.0
        encoder = _Encoder(rows)
        x = encoder(rows)
        g = _Group(encoder, _Context(rows, onehot), [cands[k] for k in keys], keys, codes,
                   np.array([joint_of.get(k, -1) for k in keys], dtype=np.int64), x, y,
                   allowed=allowed)
        if len(best_keys) == 1:
            return g  # one configuration: nothing to learn, the vote ranks
        targets = np.concatenate([y_codes, y[:, None]], axis=1)
        heads = [len(v) for v in values] + [len(best_keys)]
        seed = (self.seed + stable_hash(group)) % 2**31
        # Held-out slices of the training rows, by a hash of the key: one tenth of a large group;
        # in a small one, each fifth in turn, so that the choice does not rest on a handful of rows.
        share = np.array([stable_hash(f"learned-validation|{r.key}") for r in rows], dtype=np.uint64)
        slices = [share % 10 == 0] if len(rows) >= CROSS else [share % 5 == f for f in range(5)]
        slices = [v for v in slices if v.sum() >= 3 and (~v).sum() >= 5]
        if not slices:
            g.net = self._train(g, targets, None, heads, seed, self.epochs // 2)[0]
            return g
        scores, stops = np.zeros((2, len(self.neighbours), len(self.mixes))), []
        for val in slices:
            fit_idx = np.flatnonzero(~val)
            sub = replace(g, context=_Context([rows[i] for i in fit_idx], onehot[fit_idx]), x=x[fit_idx],
                          y=y[fit_idx], voters={})
            xv = np.concatenate([x[val], _query_context(sub, [rows[i] for i in np.flatnonzero(val)])], axis=1)
            sub.net, stop = self._train(sub, targets[fit_idx], (xv, targets[val]), heads, seed, self.epochs)
            stops.append(stop)  # the refit on every row trains for their mean
            parts = _components(sub, xv, vote=False)
            for space in range(2):
                for (a, vote), (b, mix) in itertools.product(enumerate(_vote(sub, xv, self.neighbours, space)),
                                                             enumerate(self.mixes)):
                    scores[space, a, b] += _accuracy([*parts[:2], vote], mix, sub, y_codes[val]) * val.sum()
        best = np.unravel_index(np.argmax(scores), scores.shape)  # the first best: the preferred on ties
        g.space, g.k, g.mix = int(best[0]), self.neighbours[best[1]], self.mixes[best[2]]
        g.net = self._train(g, targets, None, heads, seed, max(round(float(np.mean(stops))), 1))[0]
        return g

    def _train(self, g: _Group, targets: np.ndarray, val: tuple[np.ndarray, np.ndarray] | None,
               heads: list[int], seed: int, epochs: int) -> tuple[_Net, int]:
        """A net fitted to ``g``'s training rows (``targets``: their classes per head),
        early-stopped on ``val`` where given; and the epoch it stopped at."""
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        x, size = g.x, g.context.size
        net = _Net(x.shape[1] + g.context.width, self.hidden, heads)
        opt = torch.optim.Adam(net.parameters(), lr=3e-3, weight_decay=1e-5, foreach=True)
        tt = torch.from_numpy(targets)
        # At least ten steps an epoch on a small group; at most max_steps in all on a large one.
        batch = max(min(self.batch, max(len(x) // 10, 8)), math.ceil(len(x) * epochs / self.max_steps))
        best, best_epoch, best_state = math.inf, 0, None
        for epoch in range(1, epochs + 1):  # no dropout nor batch norm: train and eval modes are alike
            below, above, unseen = g.context.draw(rng)
            # A row drawn as of a family never tuned loses its family's one-hot too.
            xe = np.where(unseen[:, None] & g.encoder.family[None, :], 0.0, x).astype(np.float32)
            xt = torch.from_numpy(np.concatenate([xe, g.context.features(size, below, above)], axis=1))
            for part in np.array_split(rng.permutation(len(x)), max(1, len(x) // batch)):
                i = torch.from_numpy(part)
                loss = net.loss(xt[i], tt[i])
                opt.zero_grad()
                loss.backward()
                opt.step()
            if val is None:
                continue
            with torch.no_grad():
                vloss = float(net.loss(torch.from_numpy(val[0]), torch.from_numpy(val[1])))
            if vloss < best - 1e-4:
                best, best_epoch = vloss, epoch
                best_state = {k: v.clone() for k, v in net.state_dict().items()}
            elif epoch - best_epoch >= self.patience:
                break
        if best_state is not None:
            net.load_state_dict(best_state)
        return net, best_epoch or epochs

    def _model(self, row: Row) -> str:
        """The model a row belongs to: its group's; where groups are GPUs (vLLM's tables), one for
        every GPU, which then learn from each other."""
        return f"<devices of {row.kind}>" if self.pool and row.group == row.device else row.group

    def rank(self, row: Row, k: int) -> list[dict[str, Any]]:
        name: str | None = self._model(row)
        name = name if name in self._groups else self._fallback.get(tuple(sorted(row.problem)))
        if name is None or k < 1:
            return []
        g = self._groups[name]
        x = np.concatenate([g.encoder([row]), _query_context(g, [row])], axis=1)
        scores = _combine(_components(g, x), g.mix)[0]
        allowed = g.allowed.get(row.device)
        order = sorted((i for i in range(len(scores)) if allowed is None or allowed[i]),
                       key=lambda i: (-scores[i], g.keys[i]))
        return [dict(g.candidates[i]) for i in order[:k]]


def _query_context(g: _Group, rows: Sequence[Row]) -> np.ndarray:
    slots = np.array([g.context.nearest(r) for r in rows], dtype=np.int64).reshape(len(rows), 2)
    size = np.log2(np.maximum([r.volume for r in rows], 1e-9))
    return g.context.features(size, slots[:, 0], slots[:, 1])


def _candidates(rows: Sequence[Row]) -> dict[str, dict[str, Any]]:
    """The group's valid configurations by key: the bests, what training rows measured valid,
    and vLLM's grid where some row's parameters are exactly the grid's."""
    out = {config_key(r.best): dict(r.best) for r in rows}
    for key in {k for r in rows for k in (r.times or {}) if k not in r.invalid} - set(out):
        out[key] = dict(json.loads(key))
    if any(set(r.best) == set(VLLM_GRID) for r in rows):
        for combo in itertools.product(*VLLM_GRID.values()):
            c = dict(zip(VLLM_GRID, combo, strict=True))
            out.setdefault(config_key(c), c)
    return out


def _components(g: _Group, x: np.ndarray, vote: bool = True) -> list[np.ndarray | None]:
    """Per-parameter, joint and vote log-probabilities of every candidate, (rows, candidates)
    each, for the inputs ``x`` (descriptor, then context); None for the vote unless asked, and
    for the net's where the group has none."""
    votes = _vote(g, x, (g.k,), g.space)[0] if vote or g.net is None else None
    if g.net is None:
        return [None, None, votes]
    out = g.net.logprobs(x)
    param = sum((out[j][:, g.codes[:, j]] for j in range(g.codes.shape[1])), np.zeros((len(x), len(g.candidates))))
    return [param, np.where(g.joint >= 0, out[-1][:, np.maximum(g.joint, 0)], FLOOR), votes]


def _combine(parts: list[np.ndarray | None], mix: tuple[float, ...]) -> np.ndarray:
    """The mix's weighted sum of the parts plus a trace of every part, to order what the mix
    ties (a one-neighbour vote names one candidate)."""
    total = np.zeros_like(next(p for p in parts if p is not None))
    for w, p in zip(mix, parts, strict=True):
        if p is not None:
            total += (w + TRACE) * p
    return total


def _vote(g: _Group, x: np.ndarray, neighbours: tuple[int, ...], space: int, chunk: int = 256) -> list[np.ndarray]:
    """For each count of neighbours, log of the smoothed, distance-weighted share of every
    candidate among the nearest training problems (by the descriptor's logs and one-hots)."""
    classes = int(g.y.max()) + 1
    weights = g.encoder.spaces[space]
    if space not in g.voters:  # the training side, once per group
        train = g.x.astype(np.float64) * weights
        g.voters[space] = (train, (train**2).sum(axis=1))
    train, norms = g.voters[space]
    counts = np.zeros((len(neighbours), len(x), classes))
    for start in range(0, len(x), chunk):
        q = x[start:start + chunk, :g.x.shape[1]].astype(np.float64) * weights
        d = np.sqrt(np.maximum(norms[None, :] - 2.0 * q @ train.T + (q**2).sum(axis=1)[:, None], 0.0))
        top = min(max(neighbours), len(train))
        near = np.argpartition(d, top - 1, axis=1)[:, :top] if top < len(train) else \
            np.tile(np.arange(top), (len(q), 1))
        rank = np.take_along_axis(d, near, axis=1).argsort(axis=1, kind="stable")
        near = np.take_along_axis(near, rank, axis=1)
        for a, k in enumerate(neighbours):
            for i in range(len(q)):
                np.add.at(counts[a, start + i], g.y[near[i, :k]], 1.0 / (1.0 + d[i, near[i, :k]]))
    share = np.log((counts + 1e-3) / (counts.sum(axis=2, keepdims=True) + 1e-3 * classes))
    return [np.where(g.joint >= 0, s[:, np.clip(g.joint, 0, classes - 1)], FLOOR) for s in share]


def _accuracy(parts: list[np.ndarray | None], mix: tuple[float, ...], g: _Group, codes: np.ndarray) -> float:
    """Exact match, then per-parameter accuracy, of the first candidate on held-out problems."""
    right = g.codes[np.argmax(_combine(parts, mix), axis=1)] == codes
    return float(right.all(axis=1).mean()) + 1e-3 * float(right.mean())
