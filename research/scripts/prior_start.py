"""Issue 49 item 7, step 2: variants of the prior-start rule replayed on rounds 1–2 (leave one setting out).

Called by research/scripts/replay.py (its ``tables`` and ``priorstart`` commands), which passes itself in:
every variant reads the same flat grid (4 ρ × 3 seeds at B), its range at F (race.stats.drift, the other
settings' population drift) and the other settings' prior and τ (replay.prior_model) as the live rule does
(race.stats.design.prior_start, the first row). Each later row changes one principled piece, none tuned to
these grids:

- the seed term of σ² with the uncertainty of a 3-seed SD: × (t₀.₉₅ with 2 degrees of freedom / z₀.₉₅)² = 3.15,
  or the bootstrap's small-sample bias n / (n − 1) = 1.5;
- τ: the other settings' observed SD of the best ρ (sampling noise kept in), or τ² fitted by moments on the
  other settings' pilots (mean of (own ρ at F − prior)² − σ², the empirical-Bayes marginal, floored at 0.05²);
- the range: widened by the drift's between-setting SD over log10(F / B) (the spread of the population drift a
  setting's own drift is shrunk to), or the posterior predictive of a full-run grid's best ρ (its mean sampling
  variance over the other settings added), or the hull of the prior-start range and the pilots' range at F
  (what a user reads when both are shown).

Scored like every design (replay.design_at): the full-run best ρ inside the range (coverage), the range's
width, the regret at the recommended ρ in pooled full-run SEs (500 prompts, all runs). Pure reads of the
committed data; deterministic.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Callable

T_OVER_Z = 2.919986 / 1.6448536      # t₀.₉₅ (2 degrees of freedom) over z₀.₉₅
REASONERS = ("reasoner", "reasoner-math")


def _others_tau_mm(R: Any, i: int, base: str) -> float:
    """τ by moments over the other settings' 10 × B grids: mean((own − prior)² − σ²), floored at 0.05²."""
    from race.stats.design import move_sd

    name = R.grids()[i]["setting"]
    prior = R.prior_model(name)[0]
    terms = []
    for j in R.scored_learned():
        g = R.grids()[j]
        if g["setting"] == name or g["kind"] != "full10":
            continue
        at_f = R.design_at(j, base)["at_f"]
        sig2 = R._seed_var_of_best(R.evidence(g["setting"], base)["pilots"]) + move_sd(at_f) ** 2
        terms.append((at_f["recommended_rho"] - prior) ** 2 - sig2)
    return math.sqrt(max(statistics.fmean(terms), 0.05 ** 2))


def _variant(R: Any, i: int, base: str, *, seed_mult: float = 1.0, tau: str = "net",
             widen: str | None = None) -> tuple[float, float, float]:
    """(ρ, low, high) of one variant for grid ``i``."""
    from race.stats.design import Z90, move_sd, shrink_to_prior

    g = R.grids()[i]
    prior, sd, tau_net = R.prior_model(g["setting"])
    at_f = R.design_at(i, base)["at_f"]
    sig2 = R._seed_var_of_best(R.evidence(g["setting"], base)["pilots"]) * seed_mult + move_sd(at_f) ** 2
    t = {"net": tau_net, "observed": sd}.get(tau) or _others_tau_mm(R, i, base)
    s = shrink_to_prior(at_f["recommended_rho"], math.sqrt(sig2), prior=prior, prior_sd=t)
    half2 = (s.sd) ** 2
    if widen == "drift":
        half2 += (R.loso_population(g["setting"])[1] * math.log10(g["factor"])) ** 2
    elif widen == "predictive":
        half2 += statistics.fmean(R.best_sampling_var(j) for j in R.scored_learned()
                                  if R.grids()[j]["kind"] == "full10" and R.grids()[j]["setting"] != g["setting"])
    lo, hi = s.rho - Z90 * math.sqrt(half2), s.rho + Z90 * math.sqrt(half2)
    if widen == "hull":
        lo, hi = min(lo, at_f["rho_range"][0]), max(hi, at_f["rho_range"][1])
    return s.rho, lo, hi


def variants(R: Any) -> list[tuple[str, Callable[[int], tuple[float, float, float]]]]:
    base = R.FLAT

    def live(i: int) -> tuple[float, float, float]:
        s = R.prior_start_of(i, base)
        return s.rho, s.low, s.high

    def v(**kw: Any) -> Callable[[int], tuple[float, float, float]]:
        return lambda i: _variant(R, i, base, **kw)
    return [("as a verdict states it (race.stats.design.prior_start)", live),
            ("σ² seed term × (t/z)² = 3.15 (a 3-seed SD's uncertainty)", v(seed_mult=T_OVER_Z ** 2)),
            ("σ² seed term × n/(n − 1) = 1.5 (bootstrap bias)", v(seed_mult=1.5)),
            ("τ = the others' observed SD (sampling noise kept)", v(tau="observed")),
            ("τ² by moments on the others' pilots", v(tau="moments")),
            ("range widened by the drift's between-setting SD", v(widen="drift")),
            ("range: posterior predictive of a full-run grid's best", v(widen="predictive")),
            ("range: hull with the pilots' range at F", v(widen="hull"))]


def rows(R: Any) -> list[dict[str, Any]]:
    import validation as V

    sel = R.scored_learned()
    out = []
    for name, fn in variants(R):
        regs, cov, widths, per = [], 0, [], {}
        for i in sel:
            rho, lo, hi = fn(i)
            rr = R.response(i)
            regs.append(rr.regret(rho))
            cov += V._within(rr.best_rho, lo, hi)
            widths.append(hi - lo)
            if R.grids()[i]["setting"] in REASONERS:
                per[R.grids()[i]["setting"]] = rr.regret(rho)
        out.append({"variant": name, "n": len(sel), "median": statistics.median(regs), "mean": statistics.fmean(regs),
                    "covered": cov, "width": statistics.median(widths), **per})
    return out


def lines(R: Any) -> list[str]:
    sel = R.scored_learned()
    prior = R.design_summary(R.DESIGNS[0][0], sel)
    flat = R.design_summary(R.FLAT, sel)
    ref = {n: [R.design_at(i, d)["regret"] for i in sel if R.grids()[i]["setting"] == n]
           for d in (R.DESIGNS[0][0],) for n in REASONERS}
    out = [f"The prior start on the flat grid, one piece changed a row ({len(sel)} grids, leave one setting out; "
           f"prior alone: median regret {R._f(prior['regret'])}, coverage {prior['covered']}/{prior['n']}, reasoner "
           f"{R._f(ref['reasoner'][0])}, reasoner-math {R._f(ref['reasoner-math'][0])}; flat grid: "
           f"{R._f(flat['regret'])}, {flat['covered']}/{flat['n']}). Target: median no worse than the prior's and "
           "below it on both reasoners.", "",
           "| variant | regret: median; mean | coverage | width (median) | reasoner | reasoner-math | target |",
           "|---|---|---|---|---|---|---|"]
    for r in rows(R):
        met = (r["median"] <= prior["regret"] + 1e-9 and r["reasoner"] < ref["reasoner"][0]
               and r["reasoner-math"] < ref["reasoner-math"][0])
        out.append(f"| {r['variant']} | {R._f(r['median'])}; {R._f(r['mean'])} | {r['covered']}/{r['n']} | "
                   f"{r['width']:.2f} | {R._f(r['reasoner'])} | {R._f(r['reasoner-math'])} | "
                   f"{'met' if met else 'missed'} |")
    live = [R.design_at(i, "prior start + flat grid")["regret"] for i in sel]
    for who, d in (("the prior alone", R.DESIGNS[0][0]), ("the pilots' own ρ at F (flat grid)", R.FLAT)):
        other = [R.design_at(i, d)["regret"] for i in sel]
        out += ["", f"Grid by grid, the rule as a verdict states it against {who}: lower regret on "
                    f"{sum(a < b - 1e-9 for a, b in zip(live, other))}, higher on "
                    f"{sum(a > b + 1e-9 for a, b in zip(live, other))} of {len(sel)}."]
    out += ["", "What any shrinkage can reach on the reasoners: a shrunk ρ lies between the prior and the pilots' ρ at F, "
            "and the full runs' regret over that interval is at least (read every 0.005 in ρ):", ""]
    for i in sel:
        g = R.grids()[i]
        if g["setting"] not in REASONERS:
            continue
        prior = R.prior_model(g["setting"])[0]
        own = R.design_at(i, R.FLAT)["at_f"]["recommended_rho"]
        lo, hi = sorted((prior, own))
        n = max(1, round((hi - lo) / 0.005))
        best = min((lo + k * (hi - lo) / n for k in range(n + 1)), key=R.response(i).regret)
        out.append(f"- {R.label(g)}: prior {prior:.2f} (regret {R._f(R.response(i).regret(prior))}), pilots {own:.2f} "
                   f"({R._f(R.response(i).regret(own))}); the least regret between them {R._f(R.response(i).regret(best))} "
                   f"at ρ {best:.2f}; the full-run best ρ {R.response(i).best_rho:.2f}.")
    return out
