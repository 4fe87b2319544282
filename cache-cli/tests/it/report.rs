//! `tunecache report`: one self-contained page, opened in a real browser (Debian's chromium,
//! headless) for a normal cache, an empty one and a hostile one: the DOM it builds, a
//! screenshot that is not blank, and nothing on the console.

use std::path::Path;

use test_support::browser::Browser;

use crate::tunecache;

/// One JSON line: `key` (JSON object text) in `scope` (JSON object text), the candidates
/// `(algorithm, params JSON, median)`.
fn line(scope: &str, ns: &str, key: &str, candidates: &[(String, String, f64)]) -> String {
    let cands: Vec<String> = candidates
        .iter()
        .map(|(algo, params, median)| {
            format!(
                r#"{{"algo":{},"params":{params},"median_ns":{median:.1},"spread_ns":{:.1},"measured_at":1700000000000}}"#,
                serde_json::Value::from(algo.as_str()),
                median * 0.01
            )
        })
        .collect();
    format!(
        r#"{{"scope":{scope},"namespace":"{ns}","key":{key},"recorded_at":1700000000000,"candidates":[{}]}}"#,
        cands.join(",")
    )
}

/// A matmul grid on two devices whose best tiles differ by one power of two.
fn normal() -> String {
    let mut lines = Vec::new();
    for (device, shift) in [("a100", 0.0), ("h100", 1.0)] {
        for m in (4..=13).map(|p| 1i64 << p) {
            for n in [64i64, 256, 1024, 4096] {
                let ideal = ((m * n) as f64).log2() / 4.0 + shift;
                let candidates: Vec<(String, String, f64)> = (3..=8)
                    .map(|t| {
                        let median = (m * n) as f64 * (1.0 + 0.2 * (t as f64 - ideal).powi(2));
                        (
                            "blocked".to_owned(),
                            format!(r#"{{"tile":{}}}"#, 1 << t),
                            median,
                        )
                    })
                    .collect();
                let scope = format!(r#"{{"device":"{device}"}}"#);
                let key = format!(r#"{{"m":{m},"n":{n},"dtype":"f16"}}"#);
                lines.push(line(&scope, "matmul", &key, &candidates));
            }
        }
    }
    lines.join("\n") + "\n"
}

/// Keys, scopes and candidate names that are markup, in a namespace of their own.
fn hostile() -> String {
    let evil = [
        "<script>alert(1)</script>",
        "</svg><h1>x</h1>",
        "\"><img src=x onerror=alert(2)>",
        "</title></circle></svg></section>",
        "&amp; &lt; ' \u{202e}",
    ];
    let mut lines = Vec::new();
    for (i, e) in evil.iter().enumerate() {
        let text = serde_json::Value::from(*e).to_string();
        let scope = format!(r#"{{"device":{text}}}"#);
        let key = format!(
            r#"{{"m":{},"n":{},"name":{text}}}"#,
            1 << (i + 3),
            1 << (8 - i)
        );
        let candidates = vec![
            ((*e).to_owned(), format!(r#"{{"tag":{text}}}"#), 100.0),
            ("plain".to_owned(), "{}".to_owned(), 120.0),
        ];
        lines.push(line(&scope, "evil", &key, &candidates));
        lines.push(line(r#"{"device":"a100"}"#, "evil", &key, &candidates[1..]));
    }
    lines.join("\n") + "\n"
}

fn import(file: &Path, lines: &str) {
    let source = file.with_extension("jsonl");
    std::fs::write(&source, lines).expect("lines");
    let out = tunecache(file, &["import", source.to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn report(file: &Path) -> (std::path::PathBuf, String) {
    let page = file.with_extension("html");
    let out = tunecache(file, &["report", "-o", page.to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).expect("the page");
    (page, html)
}

/// Share of pixels that are not near-white, and how many distinct colours there are.
fn ink(png_path: &Path) -> (f64, usize) {
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(png_path).expect("screenshot"),
    ));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("a frame");
    let channels = info.color_type.samples();
    assert!(channels >= 3, "colour screenshot: {:?}", info.color_type);
    let pixels: Vec<&[u8]> = buf[..info.buffer_size()].chunks(channels).collect();
    let inked = pixels
        .iter()
        .filter(|p| p[..3].iter().any(|c| *c < 235))
        .count();
    let colours: std::collections::HashSet<[u8; 3]> =
        pixels.iter().map(|p| [p[0], p[1], p[2]]).collect();
    (inked as f64 / pixels.len() as f64, colours.len())
}

/// Loads `page` in the browser: its DOM, checked to hold no script and to have logged
/// nothing; then a screenshot, checked not to be blank.
fn open(browser: &Browser, page: &Path) -> String {
    let run = browser.dom(page);
    assert!(run.console.is_empty(), "console: {:?}", run.console);
    assert!(run.stdout.contains("</html>"), "no DOM: {}", run.stderr);
    let png = page.with_extension("png");
    let shot = browser.screenshot(page, &png, 1200, 1600);
    assert!(shot.console.is_empty(), "console: {:?}", shot.console);
    let (inked, colours) = ink(&png);
    assert!(inked > 0.01, "the screenshot is blank ({inked})");
    assert!(colours > 8, "the screenshot has {colours} colours");
    run.stdout
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[test]
fn a_report_of_two_devices_shows_their_winners_and_where_they_differ() {
    let Some(browser) = Browser::find() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    import(&file, &normal());
    let (page, html) = report(&file);
    assert!(
        !html.contains("src=") && !html.contains("href="),
        "nothing is fetched"
    );
    assert!(!html.contains("<script"), "no script");
    let dom = open(&browser, &page);
    assert_eq!(count(&dom, "<section class=\"namespace\""), 1);
    assert_eq!(count(&dom, "<svg class=\"winner-map\""), 1);
    assert_eq!(count(&dom, "<svg class=\"time-by-size\""), 1);
    // 80 keys (40 per device), every one drawn on both charts.
    assert_eq!(count(&dom, "<circle class=\"dot\""), 160, "{dom}");
    assert!(dom.contains("Winners by <code>m</code> and <code>n</code>"));
    assert!(dom.contains("40 keys are tuned under two or more scopes"));
    assert!(count(&dom, "<table class=\"differing\"") == 1);
    assert!(dom.contains("imported with timings"));
}

#[test]
fn an_empty_cache_gives_a_page_that_says_so() {
    let Some(browser) = Browser::find() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    import(&file, "");
    let (page, _) = report(&file);
    let run = browser.dom(&page);
    assert!(run.console.is_empty(), "console: {:?}", run.console);
    assert!(run.stdout.contains("This cache holds no entries yet."));
    assert_eq!(count(&run.stdout, "<svg"), 0);
    let png = page.with_extension("png");
    browser.screenshot(&page, &png, 800, 600);
    let (inked, _) = ink(&png);
    assert!(inked > 0.001, "the heading is drawn ({inked})");
}

/// Keys, scopes and candidate names holding `<script>`, `</svg>` and attribute breakers render
/// as text: no script element, no stray element, every chart whole.
#[test]
fn hostile_keys_render_as_text() {
    let Some(browser) = Browser::find() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    import(&file, &hostile());
    let (page, html) = report(&file);
    assert!(!html.contains("<script"), "a key became markup");
    let dom = open(&browser, &page);
    assert!(!dom.contains("<script") && !dom.contains("<img") && !dom.contains("<h1>x"));
    assert!(
        dom.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "shown as text"
    );
    assert_eq!(count(&dom, "<svg class=\"winner-map\""), 1);
    assert_eq!(count(&dom, "<svg class=\"time-by-size\""), 1);
    assert_eq!(
        count(&dom, "</svg>"),
        2,
        "no chart closed early or opened by a key"
    );
    assert_eq!(count(&dom, "<circle class=\"dot\""), 20);
}

#[test]
fn a_report_never_replaces_the_cache_it_shows() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    import(&file, &normal());
    let before = std::fs::read(&file).expect("cache");
    for target in ["c.tcache", "c.tcache.lock", "c.tcache.journal"] {
        let out = tunecache(
            &file,
            &[
                "report",
                "-o",
                dir.path().join(target).to_str().expect("utf-8"),
            ],
        );
        assert_eq!(out.status.code(), Some(1), "{target}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("the cache's own file"));
    }
    assert_eq!(std::fs::read(&file).expect("cache"), before);
    let fifo = dir.path().join("fifo.html");
    let c = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let out = tunecache(&file, &["report", "-o", fifo.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1), "a FIFO is not replaced");
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(&fifo)
            .expect("still there")
            .file_type()
            .is_fifo()
    );
}

/// A damaged cache still gives a page, which says what is wrong (escaped) and draws what can
/// be read.
#[test]
fn a_damaged_cache_gives_a_page_that_names_its_problems() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("c.tcache");
    import(&file, &normal());
    let mut bytes = std::fs::read(&file).expect("cache");
    let n = bytes.len();
    for at in (n / 3..n / 3 + 600).step_by(37) {
        bytes[at] ^= 0xFF;
    }
    std::fs::write(&file, &bytes).expect("damage");
    let verify = tunecache(&file, &["verify"]);
    assert_eq!(
        verify.status.code(),
        Some(3),
        "the damage is seen by verify"
    );
    let (_, html) = report(&file);
    assert!(
        html.contains(" problems</b>"),
        "the page names the problems"
    );
    assert!(html.contains("<ul class=\"problems\"><li><code>"));
    assert!(
        html.contains("<section class=\"namespace\""),
        "what can be read is drawn"
    );
}
