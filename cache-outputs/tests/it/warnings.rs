//! Hardening IV, case 14: on a full disk `@memoize` warned once per call (197 lines for 200
//! calls). A store that keeps failing the same way is said once, until values are stored
//! again; a failure after that is said again.

use std::io::Write;
use std::sync::{Arc, Mutex};

use cache_outputs::OutputCache;

use crate::{key, value};

/// A writer into a shared buffer, for a test's log subscriber.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn warnings(&self) -> usize {
        String::from_utf8_lossy(&self.0.lock().expect("lock"))
            .lines()
            .filter(|l| l.contains("was not stored"))
            .count()
    }
}

#[test]
fn a_store_that_keeps_failing_is_said_once_per_condition() {
    let root = test_support::temp_dir();
    let dir = root.path().join("outputs");
    let cache = OutputCache::builder(&dir)
        .memory_bytes(0)
        .open()
        .expect("open");
    let lines = Lines::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let lines = lines.clone();
            move || lines.clone()
        })
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        // The folder replaced by a file: every store fails, the same way.
        std::fs::remove_dir_all(&dir).expect("remove");
        std::fs::write(&dir, b"not a folder").expect("file");
        for i in 0..200 {
            let (stored, _) = cache.put(&key(i), value(i, 1000));
            assert!(!stored);
        }
        assert_eq!(lines.warnings(), 1, "once for 200 failed stores");
        // Stored again, then failing again: said again, once.
        std::fs::remove_file(&dir).expect("remove");
        std::fs::create_dir(&dir).expect("folder");
        assert!(cache.put(&key(1000), value(1000, 1000)).0, "stored again");
        std::fs::remove_dir_all(&dir).expect("remove");
        std::fs::write(&dir, b"not a folder").expect("file");
        for i in 2000..2050 {
            assert!(!cache.put(&key(i), value(i, 1000)).0);
        }
        assert_eq!(lines.warnings(), 2, "said again after a store worked");
    });
}
