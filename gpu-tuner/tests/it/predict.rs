//! Prediction in the tuner: top-k tuning measures only the predicted best candidates (and the
//! nearest tuned key's winner) and records a partial set that a later full tune completes by
//! measuring only the rest; a provisional choice made by prediction says so.

use gpu_tuner::OpError;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cache_core::Store as _;
use cache_core::cache_format::CandidateId;
use gpu_tuner::{MissPolicy, OpConfig, Operation, Tuner};
use serde::Serialize;

use crate::support::{open, quick};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
struct Shape {
    size: u32,
}

/// Six tiles whose declared time is best near the square root of the size (a smooth,
/// shape-dependent winner), with a log of every candidate measured.
#[derive(Default)]
struct ShapeOp {
    measured: Mutex<Vec<(u32, i64)>>,
    /// Times each tile as one a quarter its size: the best tile is four times the one the
    /// tuned keys predict (a key unlike every tuned one).
    shifted: std::sync::atomic::AtomicBool,
}

const TILES: [i64; 6] = [2, 4, 8, 16, 32, 64];

fn declared(tile: i64, size: u32) -> Duration {
    declared_log((tile as f64).log2(), size)
}

/// [`declared`] for the tile 2^`log_tile`.
fn declared_log(log_tile: f64, size: u32) -> Duration {
    let ideal = f64::from(size).log2() / 2.0;
    let off = log_tile - ideal;
    Duration::from_nanos((20_000.0 * (1.0 + 0.3 * off * off)) as u64)
}

fn best_tile(size: u32) -> i64 {
    *TILES
        .iter()
        .min_by_key(|t| declared(**t, size))
        .expect("tiles")
}

impl Operation for ShapeOp {
    type Key = Shape;
    type Handle = (i64, u32);
    type Problem = ();

    fn namespace(&self) -> &str {
        "shaped"
    }
    fn candidates(&self) -> Vec<CandidateId> {
        TILES
            .iter()
            .map(|t| CandidateId::new("tiled", &[("tile", *t)]))
            .collect()
    }
    fn prepare(&self, c: &CandidateId, key: &Shape) -> Result<(i64, u32), OpError> {
        Ok((c.int("tile").ok_or("no tile")?, key.size))
    }
    fn problem(&self, _key: &Shape) -> Result<(), OpError> {
        Ok(())
    }
    fn run(&self, _h: &(i64, u32), _p: &mut ()) -> Result<(), OpError> {
        Ok(())
    }
    fn time(&self, h: &(i64, u32), _p: &mut (), iterations: u32) -> Result<Duration, OpError> {
        let shift = if self.shifted.load(std::sync::atomic::Ordering::Relaxed) {
            2.0
        } else {
            0.0
        };
        Ok(declared_log((h.0 as f64).log2() - shift, h.1) * iterations)
    }
    fn verify(&self, h: &(i64, u32), _p: &mut ()) -> Result<(), OpError> {
        self.measured.lock().expect("log").push((h.1, h.0));
        Ok(())
    }
}

fn register(tuner: &Tuner, policy: MissPolicy) -> (Arc<ShapeOp>, gpu_tuner::Tuned<ArcOp>) {
    let op = Arc::new(ShapeOp::default());
    let config = OpConfig { policy, ..quick() };
    let tuned = tuner
        .register(ArcOp(Arc::clone(&op)), config)
        .expect("register");
    (op, tuned)
}

/// The operation behind an `Arc`, so the test keeps its log.
struct ArcOp(Arc<ShapeOp>);

impl Operation for ArcOp {
    type Key = Shape;
    type Handle = (i64, u32);
    type Problem = ();
    fn namespace(&self) -> &str {
        self.0.namespace()
    }
    fn candidates(&self) -> Vec<CandidateId> {
        self.0.candidates()
    }
    fn prepare(&self, c: &CandidateId, key: &Shape) -> Result<(i64, u32), OpError> {
        self.0.prepare(c, key)
    }
    fn problem(&self, key: &Shape) -> Result<(), OpError> {
        self.0.problem(key)
    }
    fn run(&self, h: &(i64, u32), p: &mut ()) -> Result<(), OpError> {
        self.0.run(h, p)
    }
    fn time(&self, h: &(i64, u32), p: &mut (), n: u32) -> Result<Duration, OpError> {
        self.0.time(h, p, n)
    }
    fn verify(&self, h: &(i64, u32), p: &mut ()) -> Result<(), OpError> {
        self.0.verify(h, p)
    }
}

fn measured_for(op: &ShapeOp, size: u32) -> usize {
    let log = op.measured.lock().expect("log");
    log.iter().filter(|(s, _)| *s == size).count()
}

#[test]
fn top_k_measures_the_predicted_best_and_a_full_tune_only_the_rest() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    // Train: every candidate of sizes 4^1 .. 4^8, measured.
    let (_, full) = register(&Tuner::new(Arc::clone(&cache)), MissPolicy::TuneNow);
    for p in 1..=8 {
        full.get(&Shape { size: 1 << (2 * p) }).expect("tuned");
    }
    // Sizes between them: at most the two predicted best, plus the nearest's winner.
    let (op, top) = register(&Tuner::new(Arc::clone(&cache)), MissPolicy::TopK { k: 2 });
    for size in [48, 300, 5000] {
        let choice = top.get(&Shape { size }).expect("tuned");
        let n = measured_for(&op, size);
        assert!((1..=3).contains(&n), "size {size}: {n} measured");
        assert_eq!(
            choice.candidate().int("tile"),
            Some(best_tile(size)),
            "size {size}"
        );
        assert!(!choice.is_provisional());
    }
    // The partial entry serves top-k again without measuring...
    let (op2, again) = register(&Tuner::new(Arc::clone(&cache)), MissPolicy::TopK { k: 2 });
    again.get(&Shape { size: 300 }).expect("hit");
    assert_eq!(measured_for(&op2, 300), 0);
    // ...and a full tune measures only what top-k did not, and the leader again.
    let before = measured_for(&op, 300);
    let (op3, full) = register(&Tuner::new(Arc::clone(&cache)), MissPolicy::TuneNow);
    let choice = full.get(&Shape { size: 300 }).expect("tuned");
    assert_eq!(measured_for(&op3, 300), TILES.len() - before + 1);
    let entry = cache
        .get(full.namespace(), &choice.key().fingerprint())
        .expect("entry");
    assert_eq!(entry.candidates().len(), TILES.len());
}

/// Top-k measures one candidate a round and stops once those left are predicted clearly slower
/// than the best measured; where the measurements contradict the prediction, it measures its
/// whole list.
#[test]
fn top_k_stops_early_where_the_prediction_holds_and_goes_on_where_it_does_not() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let (_, full) = register(&Tuner::new(Arc::clone(&cache)), MissPolicy::TuneNow);
    for p in 1..=8 {
        full.get(&Shape { size: 1 << (2 * p) }).expect("tuned");
    }
    let (op, top) = register(&Tuner::new(Arc::clone(&cache)), MissPolicy::TopK { k: 5 });
    for size in [48, 300, 5000] {
        let choice = top.get(&Shape { size }).expect("tuned");
        let n = measured_for(&op, size);
        assert!((1..5).contains(&n), "size {size}: {n} of 6 measured");
        assert_eq!(choice.candidate().int("tile"), Some(best_tile(size)));
    }
    // Sizes between two tiles (the prediction unsure which), timed as no tuned key was: the
    // two measured first, predicted alike, come out far apart, so the prediction is not
    // trusted and the three predicted best (and the nearest key's winner) are all measured.
    let (op, top) = register(&Tuner::new(Arc::clone(&cache)), MissPolicy::TopK { k: 3 });
    op.shifted.store(true, std::sync::atomic::Ordering::Relaxed);
    for size in [100, 2000] {
        top.get(&Shape { size }).expect("tuned");
        let n = measured_for(&op, size);
        assert!(n >= 3, "size {size}: {n} measured");
    }
}

#[test]
fn a_provisional_choice_made_by_prediction_names_its_neighbours() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let (_, full) = register(&Tuner::new(Arc::clone(&cache)), MissPolicy::TuneNow);
    for p in 1..=8 {
        full.get(&Shape { size: 1 << (2 * p) }).expect("tuned");
    }
    let (_, near) = register(
        &Tuner::new(Arc::clone(&cache)),
        MissPolicy::NearestThenTune {
            budget: Duration::ZERO,
        },
    );
    let choice = near.get(&Shape { size: 1000 }).expect("provisional");
    assert!(choice.is_provisional());
    let prediction = choice.prediction().expect("made by prediction");
    assert_eq!(prediction.neighbours.len(), 4);
    assert_eq!(choice.candidate(), prediction.winner());
    assert_eq!(choice.candidate().int("tile"), Some(best_tile(1000)));
}

/// A winner shipped for the key (an imported vLLM config, chosen without figures): a
/// provisional policy serves it while the key is tuned, a declared-default policy prefers it
/// to the default, and once measured the measurement wins.
#[test]
fn a_shipped_choice_serves_its_key_until_the_key_is_measured() {
    use cache_core::Namespace;
    use cache_core::cache_format::{Candidate, Entry, Fields, Fingerprint, Key, Origin, Value};

    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let size = 300;
    // Neither the first candidate (what a miss with nothing to predict from serves) nor the
    // declared default below.
    let shipped_tile = 32;
    assert_ne!(
        best_tile(size),
        shipped_tile,
        "the shipped config is not the best here"
    );
    let shipped = Candidate::chosen(
        "tiled",
        Fields::from([("tile".to_owned(), Value::Int(shipped_tile))]),
        "vllm config",
    );
    let key = Key::new(Fields::from([(
        "size".to_owned(),
        Value::Int(i64::from(size)),
    )]));
    let ns = Namespace::new("shaped").expect("ns");
    cache.put(
        ns,
        Entry::new(
            key,
            Fingerprint::default(),
            Origin::Imported("test".into()),
            1,
            [shipped],
        ),
    );

    let default = CandidateId::new("tiled", &[("tile", 4)]);
    let (op, never) = register(
        &Tuner::new(Arc::clone(&cache)),
        MissPolicy::Never { default },
    );
    let choice = never.get(&Shape { size }).expect("served");
    assert_eq!(
        choice.candidate().int("tile"),
        Some(shipped_tile),
        "before the declared default"
    );
    assert_eq!(measured_for(&op, size), 0);

    let (op, near) = register(
        &Tuner::new(Arc::clone(&cache)),
        MissPolicy::NearestThenTune {
            budget: Duration::from_secs(30),
        },
    );
    let choice = near.get(&Shape { size }).expect("served");
    assert!(choice.is_provisional() && choice.prediction().is_none());
    assert_eq!(choice.candidate().int("tile"), Some(shipped_tile));
    assert!(
        near.wait_background(Duration::from_secs(30)),
        "the background tune ends"
    );
    assert_eq!(
        measured_for(&op, size),
        TILES.len(),
        "every candidate measured, the shipped one too"
    );

    let (op, now) = register(&Tuner::new(Arc::clone(&cache)), MissPolicy::TuneNow);
    let choice = now.get(&Shape { size }).expect("hit");
    assert_eq!(measured_for(&op, size), 0, "nothing measured again");
    assert_eq!(
        choice.candidate().int("tile"),
        Some(best_tile(size)),
        "the measurement wins"
    );
    assert!(!choice.is_provisional());
}

/// Top-k measures the predicted best, the nearest key's winner, and the key's shipped winner.
#[test]
fn top_k_measures_a_shipped_winner_with_the_predicted_best() {
    use cache_core::Namespace;
    use cache_core::cache_format::{Candidate, Entry, Fields, Fingerprint, Key, Origin, Value};

    let dir = tempfile::tempdir().expect("dir");
    let cache = open(&dir.path().join("c.tcache"));
    let (_, full) = register(&Tuner::new(Arc::clone(&cache)), MissPolicy::TuneNow);
    for p in 1..=8 {
        full.get(&Shape { size: 1 << (2 * p) }).expect("tuned");
    }
    let size = 300;
    let shipped = Candidate::chosen(
        "tiled",
        Fields::from([("tile".to_owned(), Value::Int(64))]),
        "vllm config",
    );
    let key = Key::new(Fields::from([(
        "size".to_owned(),
        Value::Int(i64::from(size)),
    )]));
    let ns = Namespace::new("shaped").expect("ns");
    let origin = Origin::Imported("test".into());
    cache.put(
        ns,
        Entry::new(key, Fingerprint::default(), origin, 1, [shipped]),
    );
    let (op, top) = register(&Tuner::new(Arc::clone(&cache)), MissPolicy::TopK { k: 1 });
    let choice = top.get(&Shape { size }).expect("tuned");
    assert_eq!(choice.candidate().int("tile"), Some(best_tile(size)));
    let log = op.measured.lock().expect("log").clone();
    assert!(
        log.contains(&(size, 64)),
        "the shipped tile was measured: {log:?}"
    );
    assert!(log.len() < TILES.len(), "not every candidate: {log:?}");
}

/// A device never tuned: a miss there is served, at once and provisionally, the winner other
/// devices' results predict for the same key (marked transferred), and the background tune
/// then measures it here; once the device has tuned keys of its own, those predict.
#[test]
fn a_device_never_tuned_is_served_a_choice_transferred_from_other_devices() {
    use cache_core::cache_format::{Fields, Scope, Value};

    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    let device = |name: &str| {
        Scope::new(Fields::from([
            ("device".to_owned(), Value::from(name)),
            ("driver".to_owned(), Value::from("1")),
        ]))
    };
    {
        let a100 = Arc::new(crate::support::builder(&path).scope(device("A100")).open());
        let (_, full) = register(&Tuner::new(Arc::clone(&a100)), MissPolicy::TuneNow);
        full.get(&Shape { size: 300 }).expect("tuned");
        a100.flush().expect("saved");
    }
    let h100 = Arc::new(crate::support::builder(&path).scope(device("H100")).open());
    let (op, near) = register(
        &Tuner::new(Arc::clone(&h100)),
        MissPolicy::NearestThenTune {
            budget: Duration::from_secs(30),
        },
    );
    let choice = near.get(&Shape { size: 300 }).expect("served");
    assert!(choice.is_provisional());
    let prediction = choice.prediction().expect("made by prediction");
    assert!(prediction.transferred, "{prediction:?}");
    assert!(prediction.describe().contains("transferred"));
    assert_eq!(choice.candidate().int("tile"), Some(best_tile(300)));
    assert!(near.wait_background(Duration::from_secs(30)), "tuned here");
    assert_eq!(
        measured_for(&op, 300),
        TILES.len(),
        "measured here, all of them"
    );
    let again = near.get(&Shape { size: 300 }).expect("hit");
    assert!(!again.is_provisional() && again.prediction().is_none());
    // Once this device has tuned keys, a miss is predicted from them, not transferred.
    let choice = near.get(&Shape { size: 7 }).expect("served");
    assert!(choice.prediction().is_some_and(|p| !p.transferred));
}

/// A device with a few keys tuned: a miss is predicted from its own nearest keys with the
/// same key's results on other devices voting beside them, so a far key tuned here does not
/// outvote another device's measurement of this very problem (the offline figures: 93.8% of
/// the optimum from a tenth of the H100's keys alone, 96.1% with the A100's beside).
#[test]
fn a_device_with_a_few_keys_tuned_predicts_with_other_devices_results_beside_them() {
    use cache_core::cache_format::{Fields, Scope, Value};

    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    let device = |name: &str| Scope::new(Fields::from([("device".to_owned(), Value::from(name))]));
    let (far, size) = (4, 300);
    assert_ne!(
        best_tile(far),
        best_tile(size),
        "the test needs two winners"
    );
    {
        let a100 = Arc::new(crate::support::builder(&path).scope(device("A100")).open());
        let (_, full) = register(&Tuner::new(Arc::clone(&a100)), MissPolicy::TuneNow);
        full.get(&Shape { size }).expect("tuned");
        a100.flush().expect("saved");
    }
    let h100 = Arc::new(crate::support::builder(&path).scope(device("H100")).open());
    let (_, full) = register(&Tuner::new(Arc::clone(&h100)), MissPolicy::TuneNow);
    full.get(&Shape { size: far }).expect("tuned here");
    let (_, near) = register(
        &Tuner::new(Arc::clone(&h100)),
        MissPolicy::NearestThenTune {
            budget: Duration::from_secs(30),
        },
    );
    let choice = near.get(&Shape { size }).expect("served");
    let prediction = choice.prediction().expect("made by prediction");
    assert!(
        !prediction.transferred,
        "this device's key voted: {prediction:?}"
    );
    let voted: Vec<(bool, String)> = prediction
        .neighbours
        .iter()
        .map(|n| (n.elsewhere, n.key.to_string()))
        .collect();
    assert_eq!(
        voted,
        vec![
            (true, format!("{{\"size\":{size}}}")),
            (false, format!("{{\"size\":{far}}}"))
        ],
        "the other device's result for this key first (nearer), then this device's key"
    );
    assert_eq!(choice.candidate().int("tile"), Some(best_tile(size)));
    assert!(near.wait_background(Duration::from_secs(30)), "tuned here");
}

/// Transfer must not be used where the devices that tuned a key rank its candidates the
/// other way round from each other: a third device is then served the first candidate,
/// provisionally and not as a prediction, and the background tune measures everything here.
#[test]
fn a_device_is_not_served_a_transfer_from_devices_that_disagree() {
    use cache_core::Namespace;
    use cache_core::cache_format::{
        Candidate, Entry, Fields, Fingerprint, Key, Origin, Scope, Stats, Value,
    };

    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.tcache");
    let device = |name: &str| Scope::new(Fields::from([("device".to_owned(), Value::from(name))]));
    let size = 300;
    {
        let a = Arc::new(crate::support::builder(&path).scope(device("A")).open());
        let (_, full) = register(&Tuner::new(Arc::clone(&a)), MissPolicy::TuneNow);
        full.get(&Shape { size }).expect("tuned");
        a.flush().expect("saved");
    }
    {
        // Device B times every tile the other way round: the best on A is the worst here.
        let b = crate::support::builder(&path).scope(device("B")).open();
        let candidates = TILES.iter().map(|&t| {
            let ns = 1e12 / declared(t, size).as_nanos() as f64;
            let stats = Stats {
                median_ns: ns,
                min_ns: ns,
                spread_ns: 0.0,
                samples: 3,
            };
            Candidate::measured(
                "tiled",
                Fields::from([("tile".to_owned(), Value::Int(t))]),
                stats,
            )
        });
        let key = Key::new(Fields::from([(
            "size".to_owned(),
            Value::Int(i64::from(size)),
        )]));
        let entry = Entry::new(
            key,
            Fingerprint::default(),
            Origin::Measured("B".into()),
            1,
            candidates,
        );
        b.put(Namespace::new("shaped").expect("ns"), entry);
        b.flush().expect("saved");
    }
    let c = Arc::new(crate::support::builder(&path).scope(device("C")).open());
    let (op, near) = register(
        &Tuner::new(Arc::clone(&c)),
        MissPolicy::NearestThenTune {
            budget: Duration::from_secs(30),
        },
    );
    let choice = near.get(&Shape { size }).expect("served");
    assert!(choice.is_provisional());
    assert!(
        choice.prediction().is_none(),
        "transferred from devices that disagree: {:?}",
        choice.prediction()
    );
    assert_eq!(
        choice.candidate().int("tile"),
        Some(TILES[0]),
        "the first candidate"
    );
    assert!(near.wait_background(Duration::from_secs(30)), "tuned here");
    assert_eq!(
        measured_for(&op, size),
        TILES.len(),
        "measured here, all of them"
    );
    let tuned = near.get(&Shape { size }).expect("hit");
    assert_eq!(tuned.candidate().int("tile"), Some(best_tile(size)));
}
