//! The planner's own replicas still warming, with the second each is expected ready: what a
//! backlog's projection counts on a grid finer than W (see `Planner::plan`'s drain).
//!
//! The planner is told only how many replicas are warming, not when each started, so it keeps
//! the orders it placed itself and reconciles them with the count it is given at every
//! decision: replicas whose ready second has passed are dropped, a count below the kept ones
//! cancels the newest first (REPLAY.md's removal order, and a Deployment's scale-down of
//! pods not yet ready), and warming replicas it did not order (a fleet it was handed, pods
//! started by someone else, a pod past its expected warm-up) are taken to be ready one warm-up
//! from now, the latest they can be if the warm-up holds.

use std::collections::VecDeque;

/// Orders kept at most (one per decision over a warm-up of several hours; older ones merge).
const ORDERS_CAP: usize = 1024;

#[derive(Debug, Clone, Default)]
pub(super) struct OwnOrders {
    /// (second the replicas are expected ready, how many), oldest first.
    orders: VecDeque<(f64, u32)>,
}

impl OwnOrders {
    /// Bring the kept orders in line with `warming` replicas reported at `t`; `w` is the
    /// planned warm-up, used for warming replicas the planner did not order.
    pub(super) fn reconcile(&mut self, t: f64, warming: u32, w: f64) {
        while self.orders.front().is_some_and(|o| o.0 <= t) {
            self.orders.pop_front();
        }
        let mut kept: u32 = self.orders.iter().map(|o| o.1).fold(0, u32::saturating_add);
        while kept > warming {
            let Some(last) = self.orders.back_mut() else { break };
            let cut = last.1.min(kept - warming);
            last.1 -= cut;
            kept -= cut;
            if last.1 == 0 {
                self.orders.pop_back();
            }
        }
        if kept < warming {
            self.push(t + w, warming - kept);
        }
    }

    /// Record `count` replicas started now, expected ready at `ready_at` (never earlier than
    /// the kept ones: the warm-up planned is the same for all).
    pub(super) fn push(&mut self, ready_at: f64, count: u32) {
        if count == 0 {
            return;
        }
        let ready_at = self.orders.back().map_or(ready_at, |o| ready_at.max(o.0));
        if self.orders.len() >= ORDERS_CAP {
            // Out of room: the newest two merge, at the later ready second (conservative).
            if let Some((at, c)) = self.orders.pop_back() {
                if let Some(last) = self.orders.back_mut() {
                    *last = (at, last.1.saturating_add(c));
                }
            }
        }
        self.orders.push_back((ready_at, count));
    }

    /// The ready count over the next seconds: (seconds from `t`, replicas ready from then on)
    /// for a fleet with `ready` replicas now, one step per kept order.
    pub(super) fn ready_steps(&self, t: f64, ready: u32) -> impl Iterator<Item = (f64, u32)> + '_ {
        self.orders.iter().scan(ready, move |n, &(at, c)| {
            *n = n.saturating_add(c);
            Some(((at - t).max(0.0), *n))
        })
    }

    pub(super) fn approx_heap_bytes(&self) -> usize {
        self.orders.capacity() * std::mem::size_of::<(f64, u32)>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(p: &OwnOrders, t: f64, ready: u32) -> Vec<(f64, u32)> {
        p.ready_steps(t, ready).collect()
    }

    #[test]
    fn orders_become_ready_in_turn_and_leave_once_ready() {
        let mut p = OwnOrders::default();
        p.push(600.0, 3);
        p.push(615.0, 2);
        p.reconcile(100.0, 5, 600.0);
        assert_eq!(steps(&p, 100.0, 10), vec![(500.0, 13), (515.0, 15)]);
        // At 600 s the first three are ready: the fleet reports 2 warming.
        p.reconcile(600.0, 2, 600.0);
        assert_eq!(steps(&p, 600.0, 13), vec![(15.0, 15)]);
    }

    #[test]
    fn a_smaller_count_cancels_the_newest_first() {
        let mut p = OwnOrders::default();
        p.push(600.0, 3);
        p.push(615.0, 2);
        p.reconcile(100.0, 4, 600.0);
        assert_eq!(steps(&p, 100.0, 0), vec![(500.0, 3), (515.0, 4)]);
        p.reconcile(100.0, 2, 600.0);
        assert_eq!(steps(&p, 100.0, 0), vec![(500.0, 2)]);
        p.reconcile(100.0, 0, 600.0);
        assert_eq!(steps(&p, 100.0, 0), vec![]);
    }

    #[test]
    fn warming_replicas_it_did_not_order_are_ready_one_warm_up_from_now() {
        let mut p = OwnOrders::default();
        p.reconcile(50.0, 4, 600.0);
        assert_eq!(steps(&p, 50.0, 1), vec![(600.0, 5)]);
        // A pod past its expected warm-up (no GPU node yet) is still warming: expected W later.
        p.reconcile(700.0, 4, 600.0);
        assert_eq!(steps(&p, 700.0, 1), vec![(600.0, 5)]);
    }

    #[test]
    fn the_kept_orders_stay_bounded_and_keep_their_count() {
        let mut p = OwnOrders::default();
        for k in 0..(3 * ORDERS_CAP) {
            p.push(1000.0 + k as f64, 1);
        }
        assert!(p.orders.len() <= ORDERS_CAP);
        assert_eq!(p.orders.iter().map(|o| o.1).sum::<u32>(), 3 * ORDERS_CAP as u32);
        let last = steps(&p, 0.0, 0).last().copied().unwrap();
        assert_eq!(last.1, 3 * ORDERS_CAP as u32);
    }
}
