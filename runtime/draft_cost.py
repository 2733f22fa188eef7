"""`DraftCostModel`: each step's speculative draft length from measured costs and acceptance.

A draft of k tokens is worth feeding when the tokens it is expected to yield per second beat a
pass without one. Per step (one forward pass of `base` new tokens plus the k draft tokens):

- expected tokens, under the geometric acceptance model of Leviathan et al. 2023 (arXiv:2211.17192,
  eq. 1: each draft token is accepted with probability a, independently, until the first rejection;
  the pass always yields one sampled token after the accepted prefix):

      E(k) = (1 - a^(k+1)) / (1 - a)        (E(0) = 1; E(k) = k + 1 at a = 1)

- cost: C(w), the wall time of one loop cycle whose forward pass is w tokens wide (the pass, the
  mask fills of its draft positions, verification, the drafter), measured while generating: an
  exponentially weighted mean (EWMA) per bucket of widths 1, 2, 4, 8, 16, 32 (a width goes to the
  nearest bucket on a log scale), read by linear interpolation between the buckets' mean widths
  and made non-decreasing (a dip, a wide pass measured cheaper than a narrow one, is noise).
  A loaded machine, where a wide pass suffers more from sharing the cores than a narrow one, is
  seen as a steeper C.
- the choice: the k in [0, max_draft] maximising E(k) / C(base + k); k > 0 only if it beats k = 0 by
  `margin`, so drafting stops by itself where it does not pay (low acceptance, free prose, a busy
  machine) and grows to max_draft where the output copies (a near 1, C flat).

a is estimated as accepted / (accepted + rejections) over recent drafts (exponentially decayed
counts, starting from a prior): a draft accepted whole is k successes, a draft cut at its n-th token
n successes and one failure (the geometric model's maximum-likelihood estimate). Widths never
measured are extrapolated from the nearest measured bucket with an optimistic `prior_slope`
(relative cost per extra token), so they are tried once and then known. Estimates of widths not
fed for a while go stale, and a decision to draft k = 0 stops acceptance from being observed: every
`probe_every` decisions the model probes one draft of max(probe, 2k) tokens (at most one slightly
wider pass per `probe_every`: a bounded cost), so a machine that gets quiet again, or an output
that starts copying, is seen; a bucket measured after more than `probe_every` passes without one
takes the new measurement as its estimate (the old one describes the machine as it was).

Deterministic given its observations (no clock of its own): the strategy feeds it measured seconds
and acceptance; tests inject them.
"""

from __future__ import annotations

import math

from runtime.errors import InputError

BUCKETS = (1, 2, 4, 8, 16, 32)
"""Feed widths (tokens per forward pass) with a cost estimate of their own."""


class DraftCostModel:
    """Chooses draft lengths (see the module docstring). One per generation; not thread-safe.

    max_draft: the longest draft (tokens, >= 0). decay: weight of the newest measurement in a
    bucket's EWMA, in (0, 1]. acceptance_decay: factor applied to the acceptance counts per observed
    draft, in (0, 1]. prior_acceptance: a before any draft was observed, in (0, 1), worth
    `prior_weight` observed tokens. prior_slope: the cost per extra token, relative, assumed for
    widths not measured yet. margin: how much more tokens/s a draft must promise than none (0.05 =
    5%). probe_every: decisions between probes (>= 1); probe: the shortest probe draft (tokens).
    Raises ValueError for parameters outside those ranges.
    """

    def __init__(
        self,
        max_draft: int,
        *,
        decay: float = 0.3,
        acceptance_decay: float = 0.85,
        prior_acceptance: float = 0.6,
        prior_weight: float = 2.0,
        prior_slope: float = 0.02,
        margin: float = 0.05,
        probe_every: int = 16,
        probe: int = 4,
    ):
        checks = (
            ("max_draft", max_draft >= 0),
            ("decay", 0 < decay <= 1),
            ("acceptance_decay", 0 < acceptance_decay <= 1),
            ("prior_acceptance", 0 < prior_acceptance < 1),
            ("prior_weight", prior_weight > 0),
            ("prior_slope", prior_slope >= 0),
            ("margin", margin >= 0),
            ("probe_every", probe_every >= 1),
            ("probe", probe >= 1),
        )
        for name, ok in checks:
            if not ok:
                raise InputError(f"DraftCostModel: {name} out of range, got {locals()[name]!r}")
        self.max_draft = max_draft
        self.decay, self.acceptance_decay = decay, acceptance_decay
        self.prior_slope, self.margin = prior_slope, margin
        self.probe_every, self.probe = probe_every, probe
        self.accepted = prior_acceptance * prior_weight  # decayed counts of accepted draft tokens ...
        self.rejected = (1 - prior_acceptance) * prior_weight  # ... and of drafts cut by a rejection
        self.width: dict[int, float] = {}  # bucket -> EWMA of the widths measured there (tokens)
        self.seconds: dict[int, float] = {}  # bucket -> EWMA of their cycle times (s)
        self.updated: dict[int, int] = {}  # bucket -> `passes` at its last measurement
        self.passes = 0  # passes measured
        self.decisions = 0  # since the last probe
        self.probing = False  # the last decision was a probe

    # -- observations ---------------------------------------------------------------------------------

    def observe_pass(self, width: int, seconds: float) -> None:
        """One loop cycle whose forward pass was `width` tokens wide took `seconds` (wall time)."""
        if width < 1 or not math.isfinite(seconds) or seconds <= 0:
            return  # nothing to learn (a clock hiccup)
        b = min(BUCKETS, key=lambda b: abs(math.log2(width) - math.log2(b)))
        self.passes += 1
        if b not in self.seconds or self.passes - self.updated[b] > self.probe_every:
            # first measured, or stale: its estimate describes the machine as it was
            self.width[b], self.seconds[b] = float(width), seconds
        else:
            self.width[b] += self.decay * (width - self.width[b])
            self.seconds[b] += self.decay * (seconds - self.seconds[b])
        self.updated[b] = self.passes

    def observe_draft(self, drafted: int, accepted: int) -> None:
        """A draft of `drafted` tokens had its first `accepted` accepted (0 <= accepted <= drafted)."""
        if drafted < 1:
            return
        self.accepted = self.acceptance_decay * self.accepted + accepted
        self.rejected = self.acceptance_decay * self.rejected + (accepted < drafted)

    # -- estimates --------------------------------------------------------------------------------------

    @property
    def acceptance(self) -> float:
        """The per-token acceptance estimate a, in (0, 1)."""
        return self.accepted / (self.accepted + self.rejected)

    def expected_tokens(self, k: int) -> float:
        """E(k): tokens a pass with a k-token draft is expected to yield (Leviathan et al. eq. 1)."""
        a = self.acceptance
        return (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1.0

    def curve(self) -> list[tuple[float, float]]:
        """The measured cost curve: [(mean width, seconds)] by width, made non-decreasing (a wider
        pass is never cheaper: a dip is noise)."""
        points, top = [], 0.0
        for w, sec in sorted((self.width[b], self.seconds[b]) for b in self.seconds):
            top = max(top, sec)
            points.append((w, top))
        return points

    def cost(self, width: int) -> float:
        """The estimated cycle time of a `width`-token pass (s; relative units before any measurement)."""
        return self.costs([width], self.curve())[0]

    def costs(self, widths, curve: list[tuple[float, float]]) -> list[float]:
        """`cost` of each of `widths` (increasing) on `curve`, in one walk along it."""
        slope = self.prior_slope
        if not curve:
            return [1 + slope * (w - 1) for w in widths]
        out, i = [], 0
        for w in widths:
            while i < len(curve) and curve[i][0] < w:
                i += 1
            if i == 0:  # below the narrowest measured width
                out.append(curve[0][1] / (1 + slope * (curve[0][0] - w)))
            elif i == len(curve):  # past the widest: extrapolated
                out.append(curve[-1][1] * (1 + slope * (w - curve[-1][0])))
            else:
                (w0, s0), (w1, s1) = curve[i - 1], curve[i]
                out.append(s0 + (s1 - s0) * (w - w0) / (w1 - w0))
        return out

    def rate(self, k: int, base: int) -> float:
        """Expected tokens per second of a pass of `base` new tokens and a k-token draft."""
        return self.expected_tokens(k) / self.cost(base + k)

    # -- decisions --------------------------------------------------------------------------------------

    def best(self, base: int, limit: int | None = None) -> int:
        """The draft length (0..min(limit, max_draft)) with the highest expected tokens per second; 0
        unless a draft beats none by `margin`."""
        top = self.max_draft if limit is None else min(limit, self.max_draft)
        curve, a = self.curve(), self.acceptance
        costs = self.costs(range(base, base + top + 1), curve)
        rates, tokens, p = [], 0.0, 1.0  # E(k) = sum of a^j for j <= k, built up term by term
        for k in range(top + 1):
            tokens, p = tokens + p, p * a
            rates.append(tokens / costs[k])
        k = max(range(top + 1), key=rates.__getitem__)
        return k if k and rates[k] > rates[0] * (1 + self.margin) else 0

    def choose(self, base: int) -> int:
        """The draft length to ask the drafter for, before the pass of `base` (>= 1) new tokens: the
        `best`, or every `probe_every` decisions a probe of max(probe, 2 * best) tokens."""
        k = self.best(base)
        self.decisions += 1
        self.probing = self.decisions >= self.probe_every and k < self.max_draft
        if self.probing:
            self.decisions = 0
            k = min(self.max_draft, max(self.probe, 2 * k))
        return k

    def keep(self, k: int, base: int) -> int:
        """How much of a proposed k-token draft to feed (the drafter may propose fewer tokens than
        asked, the grammar cut it): all of it on a probe, else `best` limited to k."""
        return k if self.probing else self.best(base, limit=k)
