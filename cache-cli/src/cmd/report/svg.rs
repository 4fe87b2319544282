//! The report's charts as inline SVG: a scatter of keys on two log-scaled axes, each point
//! with a `<title>` (what a browser shows on hover), and horizontal bars. Every text that
//! comes from the cache goes through [`escape`].

use std::fmt::Write as _;

/// Ten colours told apart by most eyes (Tableau 10), then grey for "other".
pub(crate) const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// The colour of winners past the palette.
pub(crate) const OTHER: &str = "#d0d0d0";

/// Text made safe for HTML and SVG, in element content and in quoted attributes.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters other than tab and newline are not allowed in XML.
            c if c.is_control() && c != '\t' && c != '\n' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// At most `max` characters of `text`, with an ellipsis when cut.
pub(crate) fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// One axis: its name and range, in the units points are given in.
#[derive(Debug, Clone)]
pub(crate) struct Axis {
    pub(crate) name: String,
    pub(crate) lo: f64,
    pub(crate) hi: f64,
    /// How a tick's value is written.
    pub(crate) ticks: Ticks,
}

/// What an axis's units are.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ticks {
    /// log2 of a size: ticks at powers of two.
    Log2,
    /// log10 of nanoseconds: ticks at powers of ten, written as times.
    Log10Nanos,
}

impl Axis {
    /// An axis spanning `values` (with some room), or `None` if there are none.
    pub(crate) fn over(
        name: &str,
        values: impl Iterator<Item = f64>,
        ticks: Ticks,
    ) -> Option<Axis> {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values.filter(|v| v.is_finite()) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            return None;
        }
        let room = ((hi - lo) * 0.05).max(0.5);
        Some(Axis {
            name: name.to_owned(),
            lo: lo - room,
            hi: hi + room,
            ticks,
        })
    }

    fn at(&self, v: f64, from: f64, to: f64) -> f64 {
        from + (v - self.lo) / (self.hi - self.lo) * (to - from)
    }

    /// Tick positions (whole units, thinned to at most eight).
    fn tick_values(&self) -> Vec<f64> {
        let first = self.lo.ceil() as i64;
        let last = self.hi.floor() as i64;
        let span = (last - first).max(0) + 1;
        let step = (span as f64 / 8.0).ceil().max(1.0) as i64;
        (first..=last)
            .filter(|v| (v - first) % step == 0)
            .map(|v| v as f64)
            .collect()
    }

    fn tick_label(&self, v: f64) -> String {
        match self.ticks {
            // A size n is drawn at log2(n + 1); the tick names the power of two nearby.
            Ticks::Log2 => format_count(2f64.powf(v).round()),
            Ticks::Log10Nanos => tick_nanos(10f64.powf(v)),
        }
    }
}

/// A count, short: 512, 4K, 2M; past a trillion, as a power of two (2^45).
fn format_count(n: f64) -> String {
    if n >= 1e12 {
        format!("2^{:.0}", n.log2())
    } else if n >= 1e9 {
        format!("{:.0}G", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.0}M", n / 1e6)
    } else if n >= 1e4 {
        format!("{:.0}K", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

/// A tick's time (a power of ten of nanoseconds): 10 µs, 1 ms.
fn tick_nanos(ns: f64) -> String {
    let (v, unit) = if ns >= 1e9 {
        (ns / 1e9, "s")
    } else if ns >= 1e6 {
        (ns / 1e6, "ms")
    } else if ns >= 1e3 {
        (ns / 1e3, "µs")
    } else {
        (ns, "ns")
    };
    format!("{v:.0} {unit}")
}

/// One point of a scatter: where, its colour, and what hovering it says.
#[derive(Debug)]
pub(crate) struct Dot {
    pub(crate) x: f64,
    pub(crate) y: f64,
    pub(crate) colour: &'static str,
    pub(crate) title: String,
}

const W: f64 = 500.0;
const H: f64 = 340.0;
const LEFT: f64 = 78.0;
const BOTTOM: f64 = 40.0;
const TOP: f64 = 10.0;
const RIGHT: f64 = 10.0;

/// A scatter of `dots` on the axes `x` and `y`; `class` names the chart for the page's tests.
pub(crate) fn scatter(class: &str, x: &Axis, y: &Axis, dots: &[Dot]) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="{class}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" xmlns="http://www.w3.org/2000/svg">"#
    );
    let (x0, x1, y0, y1) = (LEFT, W - RIGHT, H - BOTTOM, TOP);
    let _ = write!(
        s,
        r##"<rect x="{x0}" y="{y1}" width="{}" height="{}" fill="#fbfbfb" stroke="#999"/>"##,
        x1 - x0,
        y0 - y1
    );
    for v in x.tick_values() {
        let px = x.at(v, x0, x1);
        let _ = write!(
            s,
            r##"<line x1="{px:.1}" y1="{y0}" x2="{px:.1}" y2="{y1}" stroke="#eee"/><text x="{px:.1}" y="{}" font-size="11" text-anchor="middle">{}</text>"##,
            y0 + 14.0,
            escape(&x.tick_label(v))
        );
    }
    for v in y.tick_values() {
        let py = y.at(v, y0, y1);
        let _ = write!(
            s,
            r##"<line x1="{x0}" y1="{py:.1}" x2="{x1}" y2="{py:.1}" stroke="#eee"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            x0 - 4.0,
            py + 4.0,
            escape(&y.tick_label(v))
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{}" font-size="12" text-anchor="middle">{}</text>"#,
        (x0 + x1) / 2.0,
        H - 6.0,
        escape(&x.name)
    );
    let _ = write!(
        s,
        r#"<text x="14" y="{:.1}" font-size="12" text-anchor="middle" transform="rotate(-90 14 {:.1})">{}</text>"#,
        (y0 + y1) / 2.0,
        (y0 + y1) / 2.0,
        escape(&y.name)
    );
    for d in dots {
        let _ = write!(
            s,
            r#"<circle class="dot" cx="{:.1}" cy="{:.1}" r="3.5" fill="{}"><title>{}</title></circle>"#,
            x.at(d.x, x0, x1),
            y.at(d.y, y0, y1),
            d.colour,
            escape(&d.title)
        );
    }
    s.push_str("</svg>");
    s
}

/// Horizontal bars: one per `(label, count)`, as shares of `total`.
pub(crate) fn bars(class: &str, rows: &[(String, usize)], total: usize) -> String {
    let mut s = String::new();
    let _ = write!(s, r#"<table class="bars {class}">"#);
    for (label, n) in rows {
        let share = if total == 0 {
            0.0
        } else {
            *n as f64 / total as f64 * 100.0
        };
        let _ = write!(
            s,
            r#"<tr><td>{}</td><td class="n">{n}</td><td class="n">{share:.1}%</td><td class="bar"><span style="width:{:.1}%"></span></td></tr>"#,
            escape(label),
            share.clamp(0.0, 100.0)
        );
    }
    s.push_str("</table>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup_and_no_control_character() {
        let hostile = "</svg><script>alert('x')</script>&\"\u{1}";
        let safe = escape(hostile);
        assert!(!safe.contains('<') && !safe.contains('>') && !safe.contains('"'));
        assert!(!safe.contains('\'') && !safe.contains('\u{1}'));
        assert_eq!(
            safe,
            "&lt;/svg&gt;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;\u{fffd}"
        );
    }

    #[test]
    fn ticks_are_whole_powers_and_at_most_eight() {
        let axis = Axis::over("m", [0.0, 40.0].into_iter(), Ticks::Log2).expect("axis");
        let ticks = axis.tick_values();
        assert!(ticks.len() <= 8 && ticks.len() >= 4, "{ticks:?}");
        assert!(ticks.iter().all(|t| t.fract() == 0.0));
        assert_eq!(axis.tick_label(10.0), "1024");
        let time = Axis::over("t", [3.0, 6.0].into_iter(), Ticks::Log10Nanos).expect("axis");
        assert_eq!(time.tick_label(6.0), "1 ms");
        assert_eq!(time.tick_label(4.0), "10 µs");
        assert!(Axis::over("none", std::iter::empty(), Ticks::Log2).is_none());
    }

    #[test]
    fn a_long_text_is_shortened_with_an_ellipsis() {
        assert_eq!(shorten("abcdef", 4), "abc…");
        assert_eq!(shorten("abc", 4), "abc");
    }
}
