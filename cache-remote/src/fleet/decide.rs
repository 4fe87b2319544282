//! The fleet's pure decisions: one look at a lease classified ([`classify`]), whether it was
//! renewed ([`renewed`]), what the acquisition loop does next ([`step`]), what waiting on
//! leases never renewed has cost (`crate::leases::Spent`), and the pause between looks.

use std::time::{Duration, Instant};

use super::Alone;
use crate::lease::{self, LeaseReply};
use crate::leases::STALL_MEMORY;

/// The longest a process waits on a leader that renews its lease (the renewal is the proof of
/// life): past it, it measures the key itself.
pub(crate) const MAX_FLEET_WAIT: Duration = Duration::from_secs(600);

/// The longest pause between two looks at a key another process is measuring.
pub(crate) const MAX_POLL: Duration = Duration::from_millis(200);

/// The first pause.
pub(crate) const FIRST_POLL: Duration = Duration::from_millis(10);

/// Whether a lease whose expiry was `before` and is `now` (both as this process reckons them:
/// the time of the look plus the time to live left) was renewed in between. A renewal moves
/// the expiry later by the time since the last one (a third of the time to live); more than
/// `slack` (the store's reckoning of a lease's age is in whole seconds on S3) is a renewal.
pub(crate) fn renewed(before: Instant, now: Instant, slack: Duration) -> bool {
    now > before + slack
}

/// One look at a key's lease, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Look {
    /// The lease was free: this process holds it now.
    Taken,
    /// Another process holds it with a tunecache lease that expires, in `left`; `holder` is
    /// what the lease says (for messages only).
    Held { holder: String, left: Duration },
    /// Not a lease to wait on or take.
    Refused(Alone),
}

/// Reads an acquire's reply for the lease key `key` (time to live `ttl`).
pub(crate) fn classify(reply: LeaseReply, key: &str, ttl: Duration) -> Look {
    match reply {
        LeaseReply::Done => Look::Taken,
        LeaseReply::Foreign(kind) => Look::Refused(Alone::Foreign {
            key: key.to_owned(),
            kind,
        }),
        // An acquire creates an absent lease: a backend answering otherwise is not followed
        // round a loop with no pause.
        LeaseReply::Absent => Look::Refused(Alone::NotTaken),
        LeaseReply::Held { value, ttl: left } => {
            // A value of another form, or one that never ends (no time to live, or more than
            // ten minutes), is not trusted.
            let Some(left) = left.filter(|l| *l <= ttl.max(STALL_MEMORY)) else {
                return Look::Refused(Alone::Untrusted {
                    key: key.to_owned(),
                });
            };
            if !lease::is_ours(&value) {
                return Look::Refused(Alone::Untrusted {
                    key: key.to_owned(),
                });
            }
            Look::Held {
                holder: lease::holder(&value),
                left,
            }
        }
    }
}

/// What the acquisition loop does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Lead: the lease is this process's (`takeover`: after waiting on another holder).
    Lead { takeover: bool },
    /// The holder published and let go since the last look: hand the lease straight back and
    /// use its entry.
    HandBack,
    /// The holder published while still holding the lease: use its entry.
    Published { by: String },
    /// Measure here, without a lease.
    Alone(Alone),
    /// Look again after a pause.
    Wait { holder: String },
}

/// Where a wait on one key stands, for [`step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waiting {
    /// An earlier look found a holder.
    pub(crate) waiting: bool,
    /// The key's entry changed since the last look into one that passes the checks.
    pub(crate) published: bool,
    /// The lease was seen renewing while this process waited on it.
    pub(crate) renewed: bool,
    /// Left of the wait asked for.
    pub(crate) left: Duration,
    /// Left of [`MAX_FLEET_WAIT`] for a lease that renews.
    pub(crate) left_renewing: Duration,
    /// Waiting charged to leases never seen renewing, this process's, and the most it may be
    /// (the wait asked for).
    pub(crate) unrenewed: (Duration, Duration),
}

/// The decision after one look. A lease seen renewing is a leader alive: waited on (up to
/// [`MAX_FLEET_WAIT`]) however long the wait asked for was. One not seen renewing is waited on
/// at most the wait, and all of them together at most the wait (a squatter's leases, whatever
/// holders they name, cost a process one wait in all, not one per key).
pub(crate) fn step(look: Look, w: Waiting, wait: Duration) -> Step {
    match look {
        Look::Refused(why) => Step::Alone(why),
        Look::Taken if w.published => Step::HandBack,
        Look::Taken => Step::Lead {
            takeover: w.waiting,
        },
        Look::Held { holder, .. } if w.published => Step::Published { by: holder },
        Look::Held { holder, .. } if w.renewed => {
            if w.left_renewing.is_zero() {
                Step::Alone(Alone::WaitedOut {
                    holder,
                    wait: MAX_FLEET_WAIT,
                })
            } else {
                Step::Wait { holder }
            }
        }
        Look::Held { holder, .. } if w.left.is_zero() => {
            Step::Alone(Alone::WaitedOut { holder, wait })
        }
        Look::Held { holder, .. } if w.unrenewed.0 >= w.unrenewed.1 => {
            Step::Alone(Alone::Stalled { holder })
        }
        Look::Held { holder, .. } => Step::Wait { holder },
    }
}

/// The pause after `pause`: doubled, at most [`MAX_POLL`].
pub(crate) fn next_pause(pause: Duration) -> Duration {
    (pause * 2).min(MAX_POLL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::LeaseReply;
    use crate::leases::Spent;

    const TTL: Duration = Duration::from_secs(30);
    const WAIT: Duration = Duration::from_secs(5);

    fn ours() -> Vec<u8> {
        lease::new_value()
    }

    fn held(value: Vec<u8>, ttl: Option<Duration>) -> LeaseReply {
        LeaseReply::Held { value, ttl }
    }

    #[test]
    fn waiting_on_leases_never_renewed_is_charged_for_a_while_and_given_back_on_a_renewal() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let spent = Spent::default().charge(t0, s(3), Duration::ZERO);
        assert_eq!(spent.at(t0 + s(1)).spent, s(3));
        let spent = spent.charge(t0 + s(2), s(4), Duration::ZERO);
        assert_eq!(spent.at(t0 + s(2)).spent, s(7));
        assert_eq!(
            spent.charge(t0 + s(3), Duration::ZERO, s(4)).spent,
            s(3),
            "given back"
        );
        assert_eq!(
            spent.at(t0 + STALL_MEMORY).spent,
            Duration::ZERO,
            "forgotten in time"
        );
        // A renewal moves the expiry later by more than the slack; time passing does not.
        assert!(renewed(t0 + s(10), t0 + s(13), s(1)));
        assert!(!renewed(
            t0 + s(10),
            t0 + s(10) + Duration::from_millis(900),
            s(1)
        ));
        assert!(!renewed(t0 + s(10), t0 + s(9), s(1)));
    }

    #[test]
    fn replies_are_classified_and_only_tunecaches_expiring_leases_are_waited_on() {
        assert_eq!(classify(LeaseReply::Done, "k", TTL), Look::Taken);
        assert_eq!(
            classify(LeaseReply::Foreign("hash".into()), "k", TTL),
            Look::Refused(Alone::Foreign {
                key: "k".into(),
                kind: "hash".into()
            })
        );
        assert_eq!(
            classify(LeaseReply::Absent, "k", TTL),
            Look::Refused(Alone::NotTaken)
        );
        let untrusted = Look::Refused(Alone::Untrusted { key: "k".into() });
        // Not our form; ours without a time to live; ours living longer than ten minutes.
        assert_eq!(
            classify(held(b"lock".to_vec(), Some(TTL)), "k", TTL),
            untrusted
        );
        assert_eq!(classify(held(ours(), None), "k", TTL), untrusted);
        let long = STALL_MEMORY + Duration::from_secs(1);
        assert_eq!(classify(held(ours(), Some(long)), "k", TTL), untrusted);
        // A lease asked for a longer time to live than ten minutes may have that long.
        let look = classify(held(ours(), Some(long)), "k", long);
        assert!(
            matches!(look, Look::Held { left, .. } if left == long),
            "{look:?}"
        );
    }

    fn w(
        waiting: bool,
        published: bool,
        renewed: bool,
        left: Duration,
        spent: Duration,
    ) -> Waiting {
        Waiting {
            waiting,
            published,
            renewed,
            left,
            left_renewing: Duration::from_secs(100),
            unrenewed: (spent, WAIT),
        }
    }

    #[test]
    fn the_loop_leads_waits_takes_a_publication_or_gives_up() {
        let held = || Look::Held {
            holder: "pid=1".into(),
            left: TTL,
        };
        let (s1, zero) = (Duration::from_secs(1), Duration::ZERO);
        let holder = || "pid=1".to_owned();
        assert_eq!(
            step(Look::Taken, w(false, false, false, s1, zero), WAIT),
            Step::Lead { takeover: false }
        );
        assert_eq!(
            step(Look::Taken, w(true, false, false, s1, zero), WAIT),
            Step::Lead { takeover: true }
        );
        assert_eq!(
            step(Look::Taken, w(true, true, false, s1, zero), WAIT),
            Step::HandBack
        );
        assert_eq!(
            step(held(), w(false, false, false, s1, zero), WAIT),
            Step::Wait { holder: holder() }
        );
        assert_eq!(
            step(held(), w(true, true, false, s1, zero), WAIT),
            Step::Published { by: holder() }
        );
        // A publication wins over a wait that just ran out.
        assert_eq!(
            step(held(), w(true, true, false, zero, zero), WAIT),
            Step::Published { by: holder() }
        );
        assert_eq!(
            step(held(), w(true, false, false, zero, zero), WAIT),
            Step::Alone(Alone::WaitedOut {
                holder: holder(),
                wait: WAIT
            })
        );
        // No wait at all: the first look gives up.
        assert!(matches!(
            step(held(), w(false, false, false, zero, zero), Duration::ZERO),
            Step::Alone(Alone::WaitedOut { .. })
        ));
        let refused = Look::Refused(Alone::NotTaken);
        assert_eq!(
            step(refused, w(true, true, false, s1, zero), WAIT),
            Step::Alone(Alone::NotTaken)
        );
    }

    #[test]
    fn a_renewing_leader_is_waited_on_past_the_wait_and_squatters_cost_one_wait_in_all() {
        let held = || Look::Held {
            holder: "pid=1".into(),
            left: TTL,
        };
        let zero = Duration::ZERO;
        // Alive (renewing): the wait asked for ran out, the leader is waited on still...
        assert_eq!(
            step(held(), w(true, false, true, zero, WAIT), WAIT),
            Step::Wait {
                holder: "pid=1".into()
            }
        );
        // ...up to the fleet's bound.
        let mut out = w(true, false, true, zero, zero);
        out.left_renewing = zero;
        assert!(matches!(
            step(held(), out, WAIT),
            Step::Alone(Alone::WaitedOut { .. })
        ));
        // Never seen renewing, with a whole wait already spent on such leases (other keys,
        // any holders): not waited on at all.
        assert_eq!(
            step(
                held(),
                w(false, false, false, Duration::from_secs(1), WAIT),
                WAIT
            ),
            Step::Alone(Alone::Stalled {
                holder: "pid=1".into()
            })
        );
        // A renewing one still is, whatever was spent.
        assert_eq!(
            step(
                held(),
                w(false, false, true, Duration::from_secs(1), WAIT * 3),
                WAIT
            ),
            Step::Wait {
                holder: "pid=1".into()
            }
        );
    }

    #[test]
    fn pauses_double_up_to_the_cap() {
        let mut pause = FIRST_POLL;
        let mut seen = vec![pause];
        for _ in 0..6 {
            pause = next_pause(pause);
            seen.push(pause);
        }
        assert_eq!(
            seen.iter().map(Duration::as_millis).collect::<Vec<_>>(),
            [10, 20, 40, 80, 160, 200, 200]
        );
    }
}
