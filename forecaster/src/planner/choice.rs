//! The choice of margin: which candidate the planner follows, priced and budgeted by the
//! status quo (the KEDA + HPA shadow, or a rate rule that beat it), and when it follows the
//! status quo itself. The knobs of that choice live here, beside the one decision that uses them.

use super::*;

/// Exponent of the budget feedback per decision.
pub(super) const BUDGET_GAIN_RATE: f64 = 0.05;
/// Lowest share of the status quo's spend the budget feedback cuts the budget to, off a grid:
/// on bursty request logs the drain and the hold add much to what the followed margin costs,
/// and only a deep cut keeps the total under the status quo's (Azure's code log at other
/// capacities overspent KEDA + HPA by 2–6 % with a 0.8 floor).
pub(super) const BUDGET_GAIN_FLOOR: f64 = 0.2;
/// ... and on a grid, where the planner's spend follows its margin closely. There the
/// feedback integrates a two-day spend ratio that answers a cut only slowly, so after an
/// overspend it wound the budget down to half the status quo's and starved the margin for a
/// day (a held-out ServeGen client at W = 420 s: 0.47 at hour 216, misses on every step up
/// until it recovered); a cut of at most a tenth still brings the spend back under the
/// status quo's (see ARCHITECTURE.md, session 20).
pub(super) const BUDGET_GAIN_FLOOR_GRID: f64 = 0.9;
/// ... unless the planner's spend over the last week (`SPEND_ACCOUNT_HALF_LIFE_S`) is over the
/// status quo's: then the grid floor is lowered by that ratio (× the setpoint) to this power,
/// down to `SPEND_ACCOUNT_MIN_FLOOR_SHARE` of itself, after the budget's two days of evidence.
/// The two-day budget forgets what the planner has overspent before; a promise of "no more
/// GPU-hours than KEDA + HPA" is about the total. Where KEDA + HPA is starved on a long ramp
/// (a held-out ServeGen client at W = 420 s: it missed 65 % of a day while prescale served
/// nearly all), a cut of a tenth left the planner 1.2 % over the status quo's total for good.
pub(super) const SPEND_ACCOUNT_HALF_LIFE_S: f64 = 7.0 * 86400.0;
pub(super) const SPEND_ACCOUNT_EXPONENT: f64 = 4.0;
pub(super) const SPEND_ACCOUNT_MIN_FLOOR_SHARE: f64 = 0.5;
/// The budget feedback aims the planner's own spend at this share of the reactive shadow's:
/// a planner held exactly at the status quo's spend ends a short trace a hair over or under
/// it by chance; 1 % below, the last hour's noise does not tip the total over.
pub(super) const BUDGET_SETPOINT: f64 = 0.99;
/// Exponent of the miss price's feedback per decision: a fifth of the budget's, so the price
/// (the outer loop) moves on the scale of an hour (×10 misses over target: ×100 in ~50 min)
/// and the budget settles under it. A fast price spends a young planner's apparent spare
/// budget on its first bursts before the budget has seen what the status quo spends later.
pub(super) const PRICE_GAIN_RATE: f64 = 0.01;

/// Price of one request served late, in seconds of one replica's service time (1/μ): the
/// planner accepts paying up to this many service-times of idle capacity to avoid a miss
/// (newsvendor reading: provision a replica when P(it is needed) > 1/150, i.e. plan near
/// the 99.3 % quantile), within the budget of the reactive shadow.
pub const MISS_PRICE_SERVICE_TIMES: f64 = 150.0;
/// SLO attainment the planner aims for before it saves money: below it, misses are priced up.
pub(super) const ATTAINMENT_TARGET: f64 = 0.995;
/// ... unless the status quo (the reactive shadow) does better than that: then the aim is
/// this share of the shadow's recent miss share (prescale's promise: a third of the misses of
/// KEDA + HPA, never more misses than it), down to `MISS_TARGET_FLOOR`.
pub(super) const SHADOW_MISS_SHARE: f64 = 1.0 / 3.0;
/// One late request in a million: where the status quo misses (almost) nothing, a planner
/// with budget to spare keeps pricing its own rare misses up. (At 1e-4 it settled for
/// 99.98 % where KEDA + HPA reached 99.99 % on a busy request log, 14 % cheaper: a rule-1
/// loss with budget left over.)
pub(super) const MISS_TARGET_FLOOR: f64 = 1e-6;
/// Below this recent miss share of the status quo, the planner follows only margins whose
/// two-day late mass is no more than the status quo's (`Counterfactual::best`). Only
/// there: where KEDA + HPA misses more, the budget and the miss price already beat it by a
/// wide margin, and the cap cost sparse clients attainment (chunk-93 at W = 180 s −0.17 pp).
pub(super) const STATUS_QUO_NEAR_PERFECT: f64 = 0.01;
/// Largest multiple of the base miss price the feedback reaches (then a miss is priced so
/// high that the choice is, in effect, the fewest misses within the budget).
pub(super) const PRICE_GAIN_MAX: f64 = 100.0;
/// The price feedback raises the price only while the planner spends less than this share of
/// the reactive shadow's spend.
pub(super) const PRICE_FEEDBACK_SPEND_SHARE: f64 = 0.9;
/// Share of the budget headroom above the followed candidate spent on mixing in a costlier one.
pub(super) const BLEND_HEADROOM_SHARE: f64 = 1.0;
/// Seconds of counterfactual evidence before the planner may follow the status quo.
pub(super) const STATUS_QUO_MIN_EVIDENCE_S: f64 = 86_400.0;
/// Seconds of evidence before a starved planner (no margin within the budget) follows the
/// status quo instead of the cheapest margin: on less, the budget is the first bursts' spend.
pub(super) const STARVED_STATUS_QUO_MIN_EVIDENCE_S: f64 = 3_600.0;
/// Decayed replica-seconds the status quo must have spent before either [`Fallback`] applies
/// (one replica-hour): an idle start leaves the budget at the first burst's spend however
/// long the evidence.
pub(super) const FALLBACK_MIN_STATUS_QUO_SPEND: f64 = 3_600.0;
/// Once the budget is spent, the margin it affords is dropped for the status quo (after the
/// same hour of evidence) while its recent late mass exceeds the status quo's by this factor:
/// a budget spent on the first bursts otherwise leaves the cheapest margins, which on a noisy
/// client after a long idle missed 10–15 % against KEDA + HPA's 2–5 % for the rest of the day.
pub(super) const OUTMISSED_FACTOR: f64 = 2.0;

/// The rate rules run beside the KEDA + HPA shadow: the rate over 2 or 3 minutes, with a
/// noise term of about one standard deviation and a multiplier around 1; two of them add the
/// rate's rise over the window projected over half or all of W + I (on a busy request log,
/// where KEDA + HPA's 25 % headroom absorbs the noise, its misses are on the ramps, which it
/// meets a warm-up late: there a rule that extrapolates the ramp beats it on both axes).
pub(super) const RATE_RULES: [RateRule; 6] = [
    RateRule { m: 1.0, z: 1.0, window_s: 120.0, trend: 0.0 },
    RateRule { m: 1.0, z: 1.0, window_s: 180.0, trend: 0.0 },
    RateRule { m: 0.9, z: 1.0, window_s: 120.0, trend: 0.0 },
    RateRule { m: 1.1, z: 0.5, window_s: 120.0, trend: 0.0 },
    RateRule { m: 1.0, z: 1.0, window_s: 120.0, trend: 0.5 },
    RateRule { m: 1.0, z: 1.0, window_s: 120.0, trend: 1.0 },
];
/// A rate rule stands in for the status quo only where it cost no more than KEDA + HPA over
/// the two-day evidence and was late on at most this share of KEDA + HPA's late mass, over
/// both the two-day and the selection evidence.
pub(super) const RATE_RULE_MISS_SHARE: f64 = 0.8;
/// Seconds of counterfactual evidence before the planner follows its choice.
pub(super) const CF_MIN_EVIDENCE_S: f64 = 600.0;

impl Planner {
    /// The status quo the planner may follow: the rate rule that beat KEDA + HPA on both
    /// cost and misses, if one did, else KEDA + HPA.
    pub(super) fn status_quo(&self) -> &ReactiveShadow {
        self.rate_rule.and_then(|k| self.rate_rules.get(k)).unwrap_or(&self.shadow)
    }

    /// The rate rule (index) with the lowest two-day cost + `price` × late among those that
    /// beat KEDA + HPA on both axes (see `RATE_RULE_MISS_SHARE`).
    pub(super) fn best_rate_rule(&self, price: f64) -> Option<usize> {
        let hpa = &self.shadow;
        let mut best: Option<(usize, f64)> = None;
        for (k, r) in self.rate_rules.iter().enumerate() {
            let beats = r.cost <= hpa.cost
                && r.late <= RATE_RULE_MISS_SHARE * hpa.late
                && r.late_s <= RATE_RULE_MISS_SHARE * hpa.late_s;
            let j = r.cost + price * r.late;
            if beats && best.is_none_or(|(_, bj)| j < bj) {
                best = Some((k, j));
            }
        }
        best.map(|(k, _)| k)
    }

    pub(super) fn cf_warm(&self) -> bool {
        self.cf.seen_s >= (self.horizon() + 120.0).max(CF_MIN_EVIDENCE_S)
    }

    /// The candidate margin in force: the counterfactual's best once it has seen enough;
    /// before that, the conservative default (hold the recent peak of the effective demand).
    pub(super) fn chosen_candidate(&mut self) -> Cand {
        if !self.cf_warm() {
            self.follow_shadow = false;
            self.fallback = None;
            return Cand::from_index(CF_N - 1);
        }
        // Price feedback: while the followed candidate's recent miss share is above the
        // attainment target, a late request is priced higher (integral feedback, like the
        // budget's), so spare budget is spent on attainment; back to the base price when met.
        if let Some(c) = self.cand_idx {
            // The followed margin's counterfactual misses, or the planner's real ones where
            // its fleet was later than the margin's.
            let late = if self.follow_shadow { self.shadow.late_s } else { self.cf.late_s[c] }.max(self.outcome.late);
            if let (Some(miss), Some(shadow_miss)) =
                (self.cf.recent_share(late), self.cf.recent_share(self.shadow.late_s))
            {
                let spare = self.own_cost < PRICE_FEEDBACK_SPEND_SHARE * self.shadow.cost;
                self.price_gain = price_feedback(self.price_gain, miss, miss_target(shadow_miss), spare);
            }
        }
        let price = self.price_gain * MISS_PRICE_SERVICE_TIMES / self.cfg.capacity;
        // Budget: the reactive shadow's spend. The candidates' counterfactual cost misses
        // what the real planner adds to them (hold, drain from the real backlog, learning
        // phase), so it is divided by the measured overhead own/followed, and an integral
        // feedback on own vs shadow spend trims it further when the planner still spends more
        // than the status quo would have.
        let off_grid = self.grid.period().is_none();
        if self.own_cost > 0.0 && self.shadow.cost > 0.0 {
            let ratio = BUDGET_SETPOINT * self.shadow.cost / self.own_cost;
            let floor = if off_grid { BUDGET_GAIN_FLOOR } else { self.grid_budget_floor() };
            self.budget_gain = (self.budget_gain * ratio.powf(BUDGET_GAIN_RATE)).clamp(floor, 1.0);
        }
        // (Below 1 when the planner spends less than the candidates it follows, e.g. after
        // the idle rules released a replica early: the unspent share goes back to the budget.)
        let overhead =
            if self.followed_cf_cost > 0.0 { (self.own_cost / self.followed_cf_cost).clamp(0.8, 2.0) } else { 1.0 };
        let budget = self.budget_gain * self.shadow.cost / overhead;
        // Spent: from here on a candidate must not outspend the status quo (see `best`).
        let spent = self.spent();
        let brake = spent.then(|| self.shadow.cost_s / overhead);
        // Where the status quo misses almost nothing, losing to it on attainment is the one way
        // left to lose: follow only margins that, over the budget's two days, were late no more
        // than it was (when one is affordable).
        let near_perfect = self.cf.recent_share(self.shadow.late_s).is_some_and(|m| m < STATUS_QUO_NEAR_PERFECT);
        let late_cap = near_perfect.then_some(self.shadow.late);
        let i = self.cf.best(price, self.cand_idx, budget, brake, late_cap);
        self.cand_idx = Some(i);
        // The status quo as one more choice, judged on the two-day evidence (the selection
        // half-life would follow the shadow right after a burst it happened to handle):
        // following a candidate costs its counterfactual spend times the planner's measured
        // overhead over it; following the shadow costs the shadow's own. Only after a day,
        // and never on a grid (where the planner's change-point pulses beat its own
        // candidates' counterfactual, so that comparison misjudges); it takes a 1.5× edge to
        // switch to the shadow and a fall below 1.2× to switch back.
        //
        // The status quo is KEDA + HPA, or a rate rule where one has beaten it on both axes
        // (on noisy request logs a rate rule with a Poisson noise term spends a few per cent
        // less for fewer misses). And when even the chosen margin is over the budget (the
        // planner has already spent what the status quo would have), the cheapest margin is
        // a poor fallback: it saves little and misses much more on noisy traffic; the status
        // quo costs what the budget is. Off a grid, after an hour of evidence.
        self.rate_rule = self.best_rate_rule(price);
        let sq = self.status_quo();
        let j_cand = self.cf.cost[i] * overhead + price * self.cf.late[i];
        let j_sq = sq.cost + price * sq.late;
        // And once spent, a margin that recently missed over twice what the status quo did is
        // no better a fallback (the budget left only the cheap ones): the status quo again.
        // Both need an hour of evidence, and an hour of one replica's worth of status-quo spend
        // in it: after a long idle the budget is the first burst's spend alone, every margin
        // looks over it, and the planner flipped between the two from one decision to the next.
        let may_fall_back = off_grid
            && self.cf.seen_s >= STARVED_STATUS_QUO_MIN_EVIDENCE_S
            && self.shadow.cost >= FALLBACK_MIN_STATUS_QUO_SPEND;
        let fallback = if !may_fall_back {
            None
        } else if self.cf.cost[i] > budget {
            Some(Fallback::Starved)
        } else if spent && self.cf.late_s[i] > OUTMISSED_FACTOR * sq.late_s {
            Some(Fallback::Outmissed)
        } else {
            None
        };
        self.fallback = fallback;
        self.follow_shadow = fallback.is_some()
            || (off_grid
                && self.cf.seen_s >= STATUS_QUO_MIN_EVIDENCE_S
                && if self.follow_shadow { j_cand >= j_sq * 1.2 } else { j_cand > j_sq * 1.5 });
        // Mixing spends the headroom left under the budget, so it waits until the budget
        // itself is settled: a few hours of counterfactual evidence (a quarter half-life).
        self.blend = if self.cf.seen_s >= 0.25 * CF_HALF_LIFE_S { self.cf.partner(i, price, budget) } else { None };
        Cand::from_index(i)
    }

    /// The budget feedback's floor on a grid: `BUDGET_GAIN_FLOOR_GRID`, lowered while the
    /// week's spend account is over the status quo's (see `SPEND_ACCOUNT_HALF_LIFE_S`).
    pub(super) fn grid_budget_floor(&self) -> f64 {
        if self.cf.seen_s < CF_HALF_LIFE_S || self.week_own_cost <= 0.0 {
            return BUDGET_GAIN_FLOOR_GRID;
        }
        let ratio = (BUDGET_SETPOINT * self.week_shadow_cost / self.week_own_cost).min(1.0);
        BUDGET_GAIN_FLOOR_GRID * ratio.powf(SPEND_ACCOUNT_EXPONENT).max(SPEND_ACCOUNT_MIN_FLOOR_SHARE)
    }

    /// Whether the planner has spent its budget (see [`Counterfactual::best`]).
    pub(super) fn spent(&self) -> bool {
        self.own_cost > BUDGET_SETPOINT * self.shadow.cost
    }

    pub(super) fn budget_stats(&self) -> BudgetStats {
        let followed = self.cand_idx.filter(|&i| i < CF_N);
        BudgetStats {
            own_replica_seconds: self.own_cost,
            shadow_replica_seconds: self.shadow.cost,
            shadow_recent_miss_share: self.cf.recent_share(self.shadow.late_s),
            followed_recent_miss_share: followed.and_then(|i| self.cf.recent_share(self.cf.late_s[i])),
            own_recent_miss_share: self.cf.recent_share(self.outcome.late),
            budget_gain: self.budget_gain,
            miss_price_gain: self.price_gain,
            spent: self.spent(),
            margin: if self.follow_shadow {
                let sq = match self.rate_rule {
                    Some(k) => format!("the status quo: {} (beat KEDA + HPA on cost and misses)", RATE_RULES[k]),
                    None => "KEDA + HPA's own count (the status quo)".to_string(),
                };
                Some(match self.fallback {
                    Some(why) => format!("{sq}; {}", why.text()),
                    None => sq,
                })
            } else {
                followed.map(|i| Cand::from_index(i).to_string())
            },
        }
    }
}
