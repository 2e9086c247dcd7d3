//! What the HPA that KEDA drives does with an answer: its tolerance.
//!
//! prescale answers the planned replica count against a target of 1 (`AverageValue`), so the
//! HPA's usage ratio is `answer / current`, and the HPA changes the count only when
//! the ratio leaves its tolerance band (Kubernetes' default 0.1; `behavior.*.tolerance` from
//! Kubernetes 1.34 with KEDA 2.18). Below that a planned change is silently dropped: from 11
//! replicas on, one more replica never comes. A scale-up the HPA would drop is therefore
//! answered as the smallest count it does apply (the plan rounded up past the tolerance: a
//! missed request costs more than a replica held for a decision), and the fleet the planner
//! plans from is the count the HPA holds, not the last answer. A scale-down within the
//! tolerance is left to the HPA (it keeps the larger fleet). Pure functions; the float
//! arithmetic is the HPA's own (`ratio` as one f64 division), so the edges match it.
//!
//! The band's edge moved between Kubernetes versions: before 1.33 a change applies when
//! `|1 − ratio| > tolerance`; from 1.33 (separate up and down tolerances) when the ratio is
//! outside `[1 − down, 1 + up]`, both ends inclusive. In f64 the two disagree exactly at the
//! scale-up edge: 11/10 and 1.0 + 0.1 are the same double, so 10 → 11 is applied by the old
//! rule (`|1 − 1.1|` rounds to 0.10000000000000009) and dropped by the new one. A count
//! counts as applied only when both rules apply it, whatever the cluster runs.

/// Whether the HPA (of any version, see above) changes `current` to `answer`.
fn outside_tolerance(current: u32, answer: u32, tolerance: f64) -> bool {
    let ratio = f64::from(answer) / f64::from(current);
    let before_1_33 = (1.0 - ratio).abs() > tolerance;
    let from_1_33 = !((1.0 - tolerance) <= ratio && ratio <= (1.0 + tolerance));
    before_1_33 && from_1_33
}

/// The count the HPA sets when it reads `answer` while holding `current`.
pub fn applied(current: u32, answer: u32, tolerance: f64) -> u32 {
    if current == 0 || outside_tolerance(current, answer, tolerance) {
        answer
    } else {
        current
    }
}

/// The answer that makes the HPA land on `plan` or, when it would drop a scale-up to `plan`,
/// on the smallest count above `plan` it applies (at most `max`; if none is, `plan`).
pub fn answer_through_tolerance(plan: u32, current: u32, tolerance: f64, max: u32) -> u32 {
    if plan <= current || applied(current, plan, tolerance) == plan {
        return plan;
    }
    (plan..=max.max(plan)).find(|&a| applied(current, a, tolerance) == a).unwrap_or(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hpa_drops_changes_within_its_tolerance_as_its_float_ratio_does() {
        // 11/10 is 1.1000000000000000888 in f64: past a tolerance of 0.1 by the old rule, but
        // it equals 1.0 + 0.1 and Kubernetes 1.33+ keeps 10; 12/10 is past both. 12/11 and
        // 9/10 are within it.
        assert_eq!(applied(10, 11, 0.1), 10);
        assert_eq!(applied(20, 22, 0.1), 20);
        assert_eq!(applied(10, 12, 0.1), 12);
        assert_eq!(applied(11, 12, 0.1), 11);
        assert_eq!(applied(10, 9, 0.1), 10);
        assert_eq!(applied(9, 8, 0.1), 8);
        assert_eq!(applied(0, 3, 0.1), 3, "from zero KEDA activates and the HPA takes the answer");
        assert_eq!(applied(20, 21, 0.0), 21);
        assert_eq!(applied(20, 20, 0.0), 20);
    }

    #[test]
    fn a_dropped_scale_up_is_answered_past_the_tolerance_and_nothing_else_changes() {
        // 11 → 12 would be dropped: 13 is the smallest count the HPA applies from 11.
        assert_eq!(answer_through_tolerance(12, 11, 0.1, 100), 13);
        assert_eq!(applied(11, 13, 0.1), 13);
        // 20 → 21 is dropped, and 22/20 is the same f64 as 11/10, on the edge: 23.
        assert_eq!(answer_through_tolerance(21, 20, 0.1, 100), 23);
        assert_eq!(answer_through_tolerance(11, 10, 0.1, 100), 12);
        // Applied as planned, scale-downs, no tolerance, and a cap that leaves no applicable count.
        assert_eq!(answer_through_tolerance(15, 11, 0.1, 100), 15);
        assert_eq!(answer_through_tolerance(10, 11, 0.1, 100), 10);
        assert_eq!(answer_through_tolerance(12, 11, 0.0, 100), 12);
        assert_eq!(answer_through_tolerance(12, 11, 0.1, 12), 12);
        assert_eq!(answer_through_tolerance(5, 0, 0.1, 100), 5);
    }
}
