//! The report page: one self-contained HTML file (inline CSS and SVG, no script, nothing
//! fetched), a section per namespace. Keys, scopes, names and candidates are user data: every
//! one goes through [`escape`].

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use cache_core::cache_format::Fingerprint;

use super::charts;
use super::gather::{Differing, Gathered, MARGIN_BINS, Namespace, Point, Provenance};
use super::svg::{OTHER, PALETTE, bars, escape, shorten};

/// Longest key or candidate text shown.
const TEXT: usize = 160;

/// Longest key or candidate text in a point's hover text (there are thousands of points).
pub(super) const HOVER: usize = 120;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px}h2{font-size:18px;border-top:1px solid #ccc;padding-top:14px;margin-top:28px}
h3{font-size:15px;margin-bottom:6px}.note{color:#666;font-size:13px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}td,th{padding:2px 8px;text-align:left;vertical-align:top}
th{border-bottom:1px solid #bbb}td.n{text-align:right;font-variant-numeric:tabular-nums}
td.bar{width:220px}td.bar span{display:inline-block;height:10px;background:#4e79a7}
.legend span.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
.legend{font-size:12px;columns:2;max-width:900px}.charts{display:flex;flex-wrap:wrap;gap:18px}figure{margin:0}
code{font-size:12px;word-break:break-all}";

/// What the page says about the file it shows.
#[derive(Debug)]
pub(crate) struct Header {
    pub(crate) path: String,
    pub(crate) app: Option<String>,
    pub(crate) schema: Option<u32>,
    /// What reading the file found wrong (the entries around damage are not shown).
    pub(crate) problems: Vec<String>,
}

/// The page for `g`; `keys` has the text of the keys listed as differing between scopes.
pub(crate) fn page(
    header: &Header,
    g: &Gathered,
    shown: usize,
    diffs: &BTreeMap<String, Differing>,
    keys: &HashMap<Fingerprint, String>,
) -> String {
    let mut s = String::with_capacity(1 << 20);
    let _ = write!(
        s,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>tunecache report: {}</title><style>{STYLE}</style></head><body>",
        escape(&shorten(&header.path, TEXT))
    );
    let _ = write!(
        s,
        "<h1>tunecache report</h1><p class=\"summary\"><code>{}</code><br>{} entries in {} namespaces and {} scopes{}{}</p>",
        escape(&header.path),
        g.entries,
        g.namespaces.len(),
        g.scopes.len(),
        match (&header.app, header.schema) {
            (Some(app), Some(schema)) =>
                format!(", application {} at schema {schema}", escape(app)),
            _ => String::new(),
        },
        if header.problems.is_empty() {
            String::new()
        } else {
            format!(
                "; <b>{} problems</b> (<code>tunecache verify</code> lists them)",
                header.problems.len()
            )
        }
    );
    if !header.problems.is_empty() {
        s.push_str("<ul class=\"problems\">");
        for p in header.problems.iter().take(10) {
            let _ = write!(s, "<li><code>{}</code></li>", escape(&shorten(p, 2 * TEXT)));
        }
        s.push_str("</ul>");
    }
    if g.entries == 0 {
        s.push_str("<p class=\"empty\">This cache holds no entries yet.</p>");
    }
    scopes_table(&mut s, g);
    let none = Differing::default();
    for (i, (name, n)) in g.namespaces.iter().enumerate() {
        if i >= shown {
            if i == shown {
                s.push_str("<h2>Other namespaces</h2><p class=\"note\">Shown as counts only: the page draws the first namespaces in full.</p><table>");
            }
            let _ = write!(
                s,
                "<tr><td><code>{}</code></td><td class=\"n\">{} keys</td></tr>",
                escape(name),
                n.keys
            );
            continue;
        }
        let diff = diffs.get(name).unwrap_or(&none);
        namespace_section(&mut s, name, n, diff, g.scopes.len(), keys);
    }
    if g.namespaces.len() > shown {
        s.push_str("</table>");
    }
    s.push_str("<p class=\"note\">Made by <code>tunecache report</code>. Hover a point for its key, winner, median and the runner-up's margin. Predictions are never stored (a provisional choice is measured before it is recorded), so no entry is counted as predicted.</p></body></html>");
    s
}

fn scopes_table(s: &mut String, g: &Gathered) {
    if g.scopes.is_empty() {
        return;
    }
    s.push_str("<h3>Scopes</h3><table class=\"scopes\"><tr><th>#</th><th>scope</th></tr>");
    for (i, scope) in g.scopes.iter().enumerate() {
        let _ = write!(
            s,
            "<tr><td>{i}</td><td><code>{}</code></td></tr>",
            escape(&shorten(&scope.to_string(), TEXT))
        );
    }
    s.push_str("</table>");
}

fn namespace_section(
    s: &mut String,
    name: &str,
    n: &Namespace,
    diff: &Differing,
    scopes: usize,
    keys: &HashMap<Fingerprint, String>,
) {
    let points = n.sample();
    let _ = write!(
        s,
        "<section class=\"namespace\"><h2><code>{}</code></h2><p>{} keys, {} distinct winners, in {} of {scopes} scopes</p>",
        escape(name),
        n.keys,
        n.winners.len(),
        n.scopes.len()
    );
    if n.sampled() {
        let _ = write!(
            s,
            "<p class=\"note sampled\">Charts draw a sample of {} of the {} keys (those of smallest key hash: uniform, the same on every run); the tables count every key.</p>",
            points.len(),
            n.keys
        );
    }
    let colours = colours(&points);
    s.push_str("<div class=\"charts\">");
    s.push_str(&charts::winner_map(&points, &colours));
    if !charts::map_is_time(&points) {
        s.push_str(&charts::time_by_size(&points, &colours));
    }
    s.push_str("</div>");
    legend(s, &colours, &points);
    provenance(s, n);
    trust(s, n);
    if diff.shared > 0 {
        scopes_side_by_side(s, diff, keys);
    }
    s.push_str("</section>");
}

/// A colour per winner, the most frequent in the sample first; the rest share [`OTHER`].
fn colours(points: &[Point]) -> HashMap<String, &'static str> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for p in points {
        if let Some(w) = &p.winner {
            *counts.entry(w).or_default() += 1;
        }
    }
    let mut order: Vec<(&str, usize)> = counts.into_iter().collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    order
        .into_iter()
        .take(PALETTE.len())
        .zip(PALETTE)
        .map(|((w, _), c)| (w.to_owned(), c))
        .collect()
}

pub(super) fn colour_of(colours: &HashMap<String, &'static str>, p: &Point) -> &'static str {
    p.winner
        .as_ref()
        .and_then(|w| colours.get(w).copied())
        .unwrap_or(OTHER)
}

fn legend(s: &mut String, colours: &HashMap<String, &'static str>, points: &[Point]) {
    let mut order: Vec<(&String, &&str)> = colours.iter().collect();
    order.sort_by_key(|(_, c)| PALETTE.iter().position(|p| p == *c));
    s.push_str("<div class=\"legend\">");
    for (w, c) in order {
        let _ = write!(
            s,
            "<div><span class=\"sw\" style=\"background:{c}\"></span><code>{}</code></div>",
            escape(&shorten(w, TEXT))
        );
    }
    if points.iter().any(|p| colour_of(colours, p) == OTHER) {
        let _ = write!(
            s,
            "<div><span class=\"sw\" style=\"background:{OTHER}\"></span>other winners, or none</div>"
        );
    }
    s.push_str("</div>");
}

fn provenance(s: &mut String, n: &Namespace) {
    s.push_str("<h3>Where the winners came from</h3>");
    let rows: Vec<(String, usize)> = Provenance::ALL
        .iter()
        .map(|p| {
            (
                p.name().to_owned(),
                n.provenance.get(p).copied().unwrap_or(0),
            )
        })
        .collect();
    s.push_str(&bars("provenance", &rows, n.keys));
}

fn trust(s: &mut String, n: &Namespace) {
    s.push_str("<h3>How far the winners can be trusted</h3>");
    let with_margin: usize = n.margins.iter().sum();
    let _ = write!(
        s,
        "<p>The runner-up's margin (how much slower the second best is) for the {with_margin} keys with two or more timed candidates; {} of them are within the winner's own spread between samples, where a run could flip the winner.</p>",
        n.within_noise
    );
    let rows: Vec<(String, usize)> = MARGIN_BINS
        .iter()
        .zip(n.margins)
        .map(|((_, label), k)| ((*label).to_owned(), k))
        .collect();
    s.push_str(&bars("margins", &rows, with_margin));
    s.push_str("<p class=\"note\">Regret and flip rates are measured by <code>tunecache stability</code>, which records nothing; the page shows what is stored.</p>");
}

fn scopes_side_by_side(s: &mut String, diff: &Differing, keys: &HashMap<Fingerprint, String>) {
    let _ = write!(
        s,
        "<h3>Scopes side by side</h3><p>{} keys are tuned under two or more scopes; the winners differ for {} of them.</p>",
        diff.shared, diff.differ
    );
    if diff.rows.is_empty() {
        return;
    }
    let mut scopes: Vec<usize> = diff
        .rows
        .iter()
        .flat_map(|(_, w)| w.keys().copied())
        .collect();
    scopes.sort_unstable();
    scopes.dedup();
    s.push_str("<table class=\"differing\"><tr><th>key</th>");
    for sc in &scopes {
        let _ = write!(s, "<th>scope {sc}</th>");
    }
    s.push_str("</tr>");
    for (fp, winners) in &diff.rows {
        let key = keys.get(fp).map_or_else(|| fp.to_hex(), Clone::clone);
        let _ = write!(
            s,
            "<tr><td><code>{}</code></td>",
            escape(&shorten(&key, TEXT))
        );
        for sc in &scopes {
            let w = match winners.get(sc) {
                Some(Some(w)) => escape(&shorten(w, TEXT)),
                Some(None) => "none".to_owned(),
                None => "-".to_owned(),
            };
            let _ = write!(s, "<td><code>{w}</code></td>");
        }
        s.push_str("</tr>");
    }
    s.push_str("</table>");
    if diff.differ > diff.rows.len() {
        let _ = write!(
            s,
            "<p class=\"note\">The first {} of {} by key hash.</p>",
            diff.rows.len(),
            diff.differ
        );
    }
}

#[cfg(test)]
mod tests {
    use cache_core::cache_format::{Candidate, Entry, Fields, Key, Origin, Scope, Stats, Value};

    use super::super::gather::Budget;
    use super::*;

    fn entry(i: u64) -> Entry {
        let key = Key::new(Fields::from([
            ("m".to_owned(), Value::Int((i % 4096) as i64 + 1)),
            ("n".to_owned(), Value::Int((i / 4096 % 512) as i64 * 8 + 8)),
            ("k".to_owned(), Value::Int((i % 97) as i64 * 64 + 64)),
            ("dtype".to_owned(), Value::from("float16")),
        ]));
        let candidates = (0..4).map(|t| {
            let median = 1000.0 + ((i * 7 + t * 13) % 101) as f64;
            let stats = Stats {
                median_ns: median,
                min_ns: median,
                spread_ns: 5.0,
                samples: 5,
            };
            let params = Fields::from([
                ("BLOCK_M".to_owned(), Value::Int(16 << t)),
                ("num_warps".to_owned(), Value::Int(4)),
            ]);
            Candidate::measured("triton", params, stats)
        });
        Entry::new(
            key,
            Fingerprint::default(),
            Origin::Measured("host pid 1".into()),
            0,
            candidates,
        )
    }

    /// A million entries in 40 namespaces and three scopes: the page stays under 5 MB and says
    /// that it samples.
    #[test]
    fn a_million_entries_give_a_page_under_five_megabytes() {
        const ENTRIES: u64 = 1_000_000;
        let scopes: Vec<Scope> = (0..3)
            .map(|d| Scope::new(Fields::from([("device".to_owned(), Value::Int(d))])))
            .collect();
        let budget = Budget::for_namespaces(40);
        let mut g = Gathered::default();
        for i in 0..ENTRIES {
            let ns = format!("op{:02}", i % 40);
            g.add(
                &scopes[(i / 40 % 3) as usize],
                &ns,
                &entry(i / 120),
                "host",
                budget,
            );
        }
        let mut diffs = BTreeMap::new();
        for (name, n) in g.namespaces.iter_mut() {
            diffs.insert(name.clone(), n.differing(budget.differing));
        }
        let header = Header {
            path: "/big.tcache".into(),
            app: None,
            schema: None,
            problems: Vec::new(),
        };
        let page = page(&header, &g, budget.namespaces, &diffs, &HashMap::new());
        eprintln!("a page of a million entries: {} bytes", page.len());
        assert!(page.len() < 5 << 20, "{} bytes", page.len());
        assert_eq!(page.matches("<section class=\"namespace\"").count(), 40);
        assert_eq!(
            page.matches("class=\"note sampled\"").count(),
            40,
            "each says it samples"
        );
        assert!(page.contains("1000000 entries in 40 namespaces and 3 scopes"));
    }
}
