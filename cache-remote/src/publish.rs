//! Publishing: entries measured here, merged with what the server holds by the one merge rule
//! ([`Entry::merge`]), through a bounded compare-and-set loop: read the current values,
//! merge, write where nothing changed meanwhile, and redo the keys that lost a race, after a
//! growing, jittered pause, while the deadline allows (at most 32 rounds). What to do with each
//! key in a round is decided by a pure function, [`plan_key`], and whether to go on by
//! [`again`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cache_core::Namespace;
use cache_format::{Entry, Fingerprint, Origin, Scope};

use crate::health::Counters;
use crate::lease::{Fences, HeldLease};
use crate::policy::Policy;
use crate::store::{Fence, RemoteError, Swap, Swapped};
use crate::value::{Expect, encode_value};

/// The most rounds one publication makes (each one read and one conditional write per key
/// that lost the previous one's race).
const MAX_ROUNDS: usize = 32;

/// The longest pause between two rounds.
const MAX_PAUSE: Duration = Duration::from_millis(50);

/// After `round` rounds (counting from 1) left `lost` keys that lost a race: the pause before
/// another round, or `None` to stop (nothing lost, the rounds spent, or no time for one
/// before `deadline`). The pause doubles from 1 ms to [`MAX_PAUSE`] and is spread by
/// `jitter` (0 to 1), so writers that collided do not collide again in step: an object store,
/// whose read and write are two requests, loses races that Redis's one-step compare does not.
pub(crate) fn again(
    round: usize,
    lost: usize,
    now: Instant,
    deadline: Instant,
    jitter: f64,
) -> Option<Duration> {
    if lost == 0 || round >= MAX_ROUNDS {
        return None;
    }
    let base = Duration::from_millis(1 << round.min(6)).min(MAX_PAUSE);
    let pause = base.mul_f64(0.5 + jitter.clamp(0.0, 1.0));
    (now + pause < deadline).then_some(pause)
}

/// What a publication left to do.
#[derive(Debug, Default)]
pub(crate) struct PublishOutcome {
    /// Keys not published yet (an error, a lost race every round): try again later.
    pub(crate) left: Vec<(Namespace, Fingerprint)>,
    /// The error that stopped it, if any.
    pub(crate) error: Option<RemoteError>,
    /// Entries the server now holds that have more than what was published (another
    /// machine's measurements of the same key, joined in): for the publisher's memory and
    /// file, so every machine's file converges to the fold.
    pub(crate) folded: Vec<(Namespace, Entry)>,
}

/// What one key needs in a round, given this machine's entry and the (checked) entry the
/// server holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum KeyPlan {
    /// The server holds all of ours already: nothing to write. `fold` is what it holds beyond
    /// ours, to take back.
    Unchanged { fold: Option<Entry> },
    /// Write `merged` (where the value read is still there). `more` says it holds more than
    /// ours (to take back once written).
    Write { merged: Entry, more: bool },
}

/// The decision for one key: pure. An entry that came from a shared tier (origin `remote`:
/// pulled, perhaps pushed back) claims no origin of its own against the server's: it takes the
/// server's, so pushing back what was pulled writes nothing and never relabels the server's
/// entry as `remote`.
pub(crate) fn plan_key(mine: &Entry, stored: Option<Entry>) -> KeyPlan {
    let Some(stored) = stored else {
        return KeyPlan::Write {
            merged: mine.clone(),
            more: false,
        };
    };
    let mut mine = mine.clone();
    if matches!(mine.origin(), Origin::Remote(_)) {
        mine.set_origin(stored.origin().clone());
    }
    let mine = &mine;
    let mut merged = stored.clone();
    merged.merge(mine.clone());
    if merged == stored {
        let fold = (stored != *mine).then_some(stored);
        return KeyPlan::Unchanged { fold };
    }
    let more = merged != *mine;
    KeyPlan::Write { merged, more }
}

/// One key being published.
struct Item {
    ns: Namespace,
    mine: Entry,
    key: String,
}

/// A write of one round: the item's index, the value read, the new bytes, and the merged
/// entry if it holds more than ours.
struct Write {
    index: usize,
    expected: Option<Vec<u8>>,
    bytes: Vec<u8>,
    more: Option<Entry>,
}

/// Publishes `entries` of `scope` within `deadline`. `force` (a caller waits for it)
/// probes even while the breaker is open.
pub(crate) fn publish(
    policy: &Policy,
    scope: &Scope,
    entries: Vec<(Namespace, Entry)>,
    deadline: Instant,
    force: bool,
    fences: &Fences,
) -> PublishOutcome {
    let keys = |entries: &[(Namespace, Entry)]| {
        entries
            .iter()
            .map(|(ns, e)| (*ns, e.fingerprint()))
            .collect()
    };
    if !policy.writes() || entries.is_empty() {
        return PublishOutcome::default();
    }
    if policy.full() {
        return PublishOutcome {
            left: keys(&entries),
            error: Some(RemoteError::Full("cooling down".to_owned())),
            folded: Vec::new(),
        };
    }
    if !force && !policy.allow(policy.options.budget) {
        return PublishOutcome {
            left: keys(&entries),
            error: Some(RemoteError::Unreachable(
                "the breaker is open after an outage".to_owned(),
            )),
            folded: Vec::new(),
        };
    }
    let mut todo: Vec<Item> = entries
        .into_iter()
        .map(|(ns, mine)| Item {
            key: policy.layout.key(scope, ns.name(), &mine.fingerprint()),
            ns,
            mine,
        })
        .collect();
    let mut outcome = PublishOutcome::default();
    for rounds in 1.. {
        match round(
            policy,
            scope,
            &todo,
            (deadline, fences),
            &mut outcome.folded,
        ) {
            Ok(lost) if lost.is_empty() => return outcome,
            Ok(lost) => {
                todo = todo
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| lost.contains(i))
                    .map(|(_, item)| item)
                    .collect();
            }
            Err(e) => {
                outcome.error = Some(e);
                break;
            }
        }
        match again(
            rounds,
            todo.len(),
            Instant::now(),
            deadline,
            crate::jitter::jitter(),
        ) {
            Some(pause) => std::thread::sleep(pause),
            None => break,
        }
    }
    outcome.left = todo.iter().map(|i| (i.ns, i.mine.fingerprint())).collect();
    outcome
}

/// One round: read, plan, compare-and-set (fenced where this process holds the key's
/// lease). Returns the indices that lost a race.
fn round(
    policy: &Policy,
    scope: &Scope,
    todo: &[Item],
    (deadline, fences): (Instant, &Fences),
    folded: &mut Vec<(Namespace, Entry)>,
) -> Result<Vec<usize>, RemoteError> {
    let keys: Vec<String> = todo.iter().map(|i| i.key.clone()).collect();
    let current = policy.remote.get_many(&keys, policy.read(None), deadline);
    policy.outcome(&current);
    let scope_fp = scope.fingerprint();
    let mut writes = Vec::new();
    for (index, (item, value)) in todo.iter().zip(current?).enumerate() {
        if value.as_ref().is_some_and(Vec::is_empty) {
            // Someone else's value of another type (or an empty string) at the key: not
            // ours to replace. The key is left alone and not tried again this round.
            policy.reject("squatted");
            continue;
        }
        let fp = item.mine.fingerprint();
        let expect = Expect {
            scope: &scope_fp,
            ns: item.ns.name(),
            fp: &fp,
        };
        let stored = value
            .as_deref()
            .and_then(|bytes| policy.check(bytes, expect))
            .map(|(_, e)| e);
        match plan_key(&item.mine, stored) {
            KeyPlan::Unchanged { fold } => {
                Counters::bump(&policy.counters.unchanged, 1);
                folded.extend(fold.map(|e| (item.ns, e)));
            }
            KeyPlan::Write { merged, more } => {
                let bytes = encode_value(&policy.registry, scope, item.ns.name(), &merged);
                if bytes.len() > policy.options.max_value_bytes {
                    policy.reject("oversized");
                    continue;
                }
                writes.push(Write {
                    index,
                    expected: value,
                    bytes,
                    more: more.then_some(merged),
                });
            }
        }
    }
    if writes.is_empty() {
        return Ok(Vec::new());
    }
    let held: Vec<Option<(&Arc<HeldLease>, bool)>> = writes
        .iter()
        .map(|w| {
            let item = &todo[w.index];
            let held = fences.get(&(item.ns, item.mine.fingerprint()));
            held.map(|h| (h, h.finishing.load(Ordering::Relaxed)))
        })
        .collect();
    let swaps: Vec<Swap<'_>> = writes
        .iter()
        .zip(&held)
        .map(|(w, held)| Swap {
            key: &todo[w.index].key,
            expected: w.expected.as_deref(),
            value: &w.bytes,
            fence: held.map(|(h, release)| Fence {
                lease: &h.key,
                value: &h.value,
                unchanged: h.seen == w.expected,
                release,
            }),
        })
        .collect();
    let done = policy
        .remote
        .compare_and_set_many(&swaps, policy.options.ttl, deadline);
    policy.outcome(&done);
    let done = done?;
    if done.len() != swaps.len() {
        return Err(RemoteError::Protocol(format!(
            "{} answers to {} compare-and-set commands",
            done.len(),
            swaps.len()
        )));
    }
    let mut lost = Vec::new();
    for ((w, result), held) in writes.into_iter().zip(done).zip(held) {
        if !settle(policy, &todo[w.index], result, held, w.more, folded) {
            lost.push(w.index);
        }
    }
    Ok(lost)
}

/// Takes in what one write did; `false` if it lost a race (the key is tried again).
fn settle(
    policy: &Policy,
    item: &Item,
    result: Swapped,
    held: Option<(&Arc<HeldLease>, bool)>,
    more: Option<Entry>,
    folded: &mut Vec<(Namespace, Entry)>,
) -> bool {
    match result {
        Swapped::Set => {
            Counters::bump(&policy.counters.published, 1);
            if let Some((h, true)) = held {
                h.released.store(true, Ordering::Relaxed);
            }
            folded.extend(more.map(|e| (item.ns, e)));
        }
        Swapped::Fenced => {
            policy.reject("fenced");
            if let Some((h, _)) = held {
                h.fenced.store(true, Ordering::Relaxed);
            }
            tracing::warn!(
                "tunecache: the measurements of {} were not published: their lease was \
                 lost and another process took the key over",
                item.key
            );
        }
        Swapped::Changed => {
            Counters::bump(&policy.counters.conflicts, 1);
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use cache_format::{Candidate, Fields, Key, Stats, Value};

    fn entry(cands: &[(&str, f64, u64)]) -> Entry {
        let key = Key::new(Fields::from([("m".to_owned(), Value::Int(1))]));
        let cs = cands.iter().map(|(algo, median, at)| {
            let stats = Stats {
                median_ns: *median,
                min_ns: *median,
                spread_ns: 0.0,
                samples: 3,
            };
            let mut c = Candidate::measured(*algo, Fields::new(), stats);
            c.measured_at = *at;
            c
        });
        Entry::new(
            key,
            Fingerprint::default(),
            cache_core::measured_here(),
            5,
            cs,
        )
    }

    #[test]
    fn rounds_go_on_while_keys_lose_races_with_growing_pauses_and_stop_in_time() {
        let now = Instant::now();
        let later = now + Duration::from_secs(10);
        assert_eq!(again(1, 0, now, later, 0.5), None, "nothing lost");
        assert_eq!(again(1, 3, now, later, 0.5), Some(Duration::from_millis(2)));
        assert_eq!(again(3, 3, now, later, 0.0), Some(Duration::from_millis(4)));
        assert_eq!(again(20, 1, now, later, 1.0), Some(MAX_PAUSE.mul_f64(1.5)));
        assert_eq!(
            again(MAX_ROUNDS, 1, now, later, 0.5),
            None,
            "the rounds spent"
        );
        assert_eq!(
            again(1, 1, now, now + Duration::from_micros(500), 0.5),
            None,
            "no time left"
        );
    }

    #[test]
    fn a_key_the_server_lacks_is_written_as_it_is() {
        let mine = entry(&[("a", 10.0, 1)]);
        assert_eq!(
            plan_key(&mine, None),
            KeyPlan::Write {
                merged: mine.clone(),
                more: false
            }
        );
    }

    #[test]
    fn a_key_the_server_holds_in_full_is_not_written_and_its_extra_is_folded_back() {
        let mine = entry(&[("a", 10.0, 1)]);
        assert_eq!(
            plan_key(&mine, Some(mine.clone())),
            KeyPlan::Unchanged { fold: None }
        );
        let theirs = {
            let mut e = entry(&[("b", 8.0, 2)]);
            e.merge(mine.clone());
            e
        };
        assert_eq!(
            plan_key(&mine, Some(theirs.clone())),
            KeyPlan::Unchanged { fold: Some(theirs) }
        );
    }

    #[test]
    fn an_entry_pulled_from_the_server_and_pushed_back_writes_nothing() {
        let theirs = entry(&[("a", 10.0, 1)]);
        let mut pulled = theirs.clone();
        pulled.set_origin(Origin::Remote("redis://h".into()));
        assert_eq!(
            plan_key(&pulled, Some(theirs)),
            KeyPlan::Unchanged { fold: None }
        );
    }

    #[test]
    fn a_key_both_measured_is_written_merged_and_taken_back() {
        let mine = entry(&[("a", 10.0, 1)]);
        let theirs = entry(&[("b", 8.0, 2)]);
        let KeyPlan::Write { merged, more } = plan_key(&mine, Some(theirs.clone())) else {
            panic!("a write")
        };
        assert!(more, "the merge holds another machine's candidate");
        let mut expected = theirs;
        expected.merge(mine);
        assert_eq!(merged, expected);
        assert_eq!(merged.candidates().len(), 2);
    }
}
