//! Dependency-free SVG charts for the simulation reports: [`line_plot`], [`step_plot`] and grouped
//! [`bar_chart`].
//!
//! The output is a standalone SVG 1.1 document (pure string, no IO). Series are told apart by
//! colour (the Okabe–Ito palette, safe for colour-blind readers) *and* by a second channel that
//! survives grayscale printing: dash patterns and marker shapes for lines, hatch patterns for bars.
//! Labels are XML-escaped. Non-finite values (NaN, ±∞) are skipped — a line is broken at them, a
//! bar is left out — and empty inputs give an empty frame saying "no data"; nothing panics.

use std::fmt::Write;

/// One line of a [`line_plot`] or [`step_plot`]: a legend label and `(x, y)` points in drawing
/// order.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points in drawing order; non-finite coordinates break the line.
    pub points: Vec<(f64, f64)>,
}

const WIDTH: f64 = 800.0;
const HEIGHT: f64 = 480.0;
const MARGIN_LEFT: f64 = 80.0;
const MARGIN_TOP: f64 = 44.0;
const MARGIN_BOTTOM: f64 = 64.0;
const MARGIN_RIGHT: f64 = 20.0;
const FONT: &str = "font-family=\"Helvetica, Arial, sans-serif\"";
/// Series drawn with markers only if they have at most this many points.
const MAX_MARKED_POINTS: usize = 40;

/// Okabe–Ito colours, ordered so that neighbours also differ in lightness.
const COLORS: [&str; 8] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#000000", "#D55E00", "#56B4E9", "#F0E442",
];
/// Dash patterns for lines (`""` = solid).
const DASHES: [&str; 6] = ["", "8 4", "2 3", "10 3 2 3", "4 2", "12 4 2 4 2 4"];

/// Escapes text for XML content and attribute values (`& < > " '`).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters other than tab/newline are not allowed in XML 1.0.
            c if c.is_control() && c != '\t' && c != '\n' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// A linear axis: data range and tick positions.
#[derive(Debug, Clone)]
struct Axis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    step: f64,
}

/// A "nice" step (1, 2 or 5 × 10^k) giving about `target` intervals over `span`.
fn nice_step(span: f64, target: f64) -> f64 {
    let raw = span / target;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = if norm < 1.5 {
        1.0
    } else if norm < 3.5 {
        2.0
    } else if norm < 7.5 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

impl Axis {
    /// An axis covering the finite values of `values` (and 0 if `include_zero`), extended to whole
    /// ticks. Falls back to [0, 1] without finite values.
    fn new(values: impl Iterator<Item = f64>, include_zero: bool) -> Self {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values.filter(|v| v.is_finite()) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if include_zero {
            lo = lo.min(0.0);
            hi = hi.max(0.0);
        }
        if !lo.is_finite() || !hi.is_finite() {
            (lo, hi) = (0.0, 1.0);
        }
        if hi - lo <= 1e-12 * hi.abs().max(lo.abs()) || hi - lo < 1e-300 {
            // A single value: centre it in a range of ±10 % (or ±1 near zero).
            let pad = if lo.abs() > 1e-200 {
                lo.abs() * 0.1
            } else {
                1.0
            };
            (lo, hi) = ((lo - pad).max(f64::MIN), (hi + pad).min(f64::MAX));
            if include_zero && lo < 0.0 && lo + pad >= 0.0 {
                lo = 0.0;
            }
        }
        // Halves keep the span finite even for values near ±f64::MAX.
        let step = nice_step(hi / 2.0 - lo / 2.0, 2.5);
        let (nlo, nhi) = ((lo / step).floor() * step, (hi / step).ceil() * step);
        let extended = nlo.is_finite() && nhi.is_finite();
        let (lo, hi) = if extended { (nlo, nhi) } else { (lo, hi) };
        let count = (hi / step - lo / step).round();
        let ticks = if extended && (1.0..=20.0).contains(&count) {
            (0..=count as usize)
                .map(|i| lo + i as f64 * step)
                .filter(|t| t.is_finite())
                .collect()
        } else {
            vec![lo, hi]
        };
        Self {
            lo,
            hi,
            ticks,
            step,
        }
    }

    /// Maps a value to `[0, 1]` along the axis.
    fn frac(&self, v: f64) -> f64 {
        let f = (v / 2.0 - self.lo / 2.0) / (self.hi / 2.0 - self.lo / 2.0);
        if f.is_finite() { f } else { 0.5 }
    }

    /// Formats a tick value with as many decimals as the step needs.
    fn label(&self, v: f64) -> String {
        format_number(v, self.step)
    }
}

/// Formats `v` for a tick label given the tick `step`.
fn format_number(v: f64, step: f64) -> String {
    let v = if v.abs() < step * 1e-9 { 0.0 } else { v };
    let mag = v.abs().max(step.abs());
    if mag >= 1e7 || (mag > 0.0 && mag < 1e-4) {
        let s = format!("{v:.2e}");
        // "1.20e7" → "1.2e7", "1.00e7" → "1e7"
        match s.split_once('e') {
            Some((m, e)) => {
                let m = m.trim_end_matches('0').trim_end_matches('.');
                format!("{m}e{e}")
            }
            None => s,
        }
    } else {
        let decimals = (-step.log10().floor()).clamp(0.0, 6.0) as usize;
        let decimals = if (step * 10f64.powi(decimals as i32)).fract().abs() > 1e-6 {
            decimals + 1
        } else {
            decimals
        };
        format!("{v:.decimals$}")
    }
}

/// The drawing area and document under construction.
struct Canvas {
    out: String,
    left: f64,
    top: f64,
    width: f64,
    height: f64,
}

impl Canvas {
    /// Starts a document with `title` and a plot area leaving `legend_width` on the right.
    fn new(title: &str, legend_width: f64) -> Self {
        let mut out = String::new();
        let _ = write!(
            out,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" \
             width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" {FONT} \
             font-size=\"12\">\n<title>{t}</title>\n<rect width=\"100%\" height=\"100%\" \
             fill=\"white\"/>\n<text x=\"{x}\" y=\"24\" text-anchor=\"middle\" font-size=\"16\" \
             font-weight=\"bold\">{t}</text>\n",
            t = escape(title),
            x = WIDTH / 2.0,
        );
        Self {
            out,
            left: MARGIN_LEFT,
            top: MARGIN_TOP,
            width: WIDTH - MARGIN_LEFT - MARGIN_RIGHT - legend_width,
            height: HEIGHT - MARGIN_TOP - MARGIN_BOTTOM,
        }
    }

    fn x(&self, frac: f64) -> f64 {
        self.left + frac * self.width
    }

    fn y(&self, frac: f64) -> f64 {
        self.top + (1.0 - frac) * self.height
    }

    /// Frame, horizontal grid, y ticks and the y label.
    fn y_axis(&mut self, axis: &Axis, label: &str) {
        for &t in &axis.ticks {
            let y = self.y(axis.frac(t));
            let _ = write!(
                self.out,
                "<line x1=\"{:.2}\" y1=\"{y:.2}\" x2=\"{:.2}\" y2=\"{y:.2}\" stroke=\"#dddddd\"/>\n\
                 <text x=\"{:.2}\" y=\"{:.2}\" text-anchor=\"end\">{}</text>\n",
                self.left,
                self.left + self.width,
                self.left - 6.0,
                y + 4.0,
                escape(&axis.label(t)),
            );
        }
        let (cx, cy) = (18.0, self.top + self.height / 2.0);
        let _ = writeln!(
            self.out,
            "<text x=\"{cx}\" y=\"{cy:.2}\" text-anchor=\"middle\" \
             transform=\"rotate(-90 {cx} {cy:.2})\">{}</text>",
            escape(label)
        );
    }

    /// X ticks (numeric) and the x label.
    fn x_axis(&mut self, axis: &Axis, label: &str) {
        let bottom = self.top + self.height;
        for &t in &axis.ticks {
            let x = self.x(axis.frac(t));
            let _ = write!(
                self.out,
                "<line x1=\"{x:.2}\" y1=\"{bottom:.2}\" x2=\"{x:.2}\" y2=\"{:.2}\" stroke=\"black\"/>\n\
                 <text x=\"{x:.2}\" y=\"{:.2}\" text-anchor=\"middle\">{}</text>\n",
                bottom + 5.0,
                bottom + 18.0,
                escape(&axis.label(t)),
            );
        }
        self.x_label(label);
    }

    fn x_label(&mut self, label: &str) {
        let _ = writeln!(
            self.out,
            "<text x=\"{:.2}\" y=\"{:.2}\" text-anchor=\"middle\">{}</text>",
            self.left + self.width / 2.0,
            HEIGHT - 14.0,
            escape(label)
        );
    }

    fn frame(&mut self) {
        let _ = writeln!(
            self.out,
            "<rect x=\"{:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{:.2}\" fill=\"none\" \
             stroke=\"black\"/>",
            self.left, self.top, self.width, self.height
        );
    }

    fn no_data(&mut self) {
        let _ = writeln!(
            self.out,
            "<text x=\"{:.2}\" y=\"{:.2}\" text-anchor=\"middle\" fill=\"#666666\">no data</text>",
            self.left + self.width / 2.0,
            self.top + self.height / 2.0
        );
    }

    /// Legend entries on the right; `swatch` draws the key for entry `i` at (x, y).
    fn legend(&mut self, labels: &[&str], mut swatch: impl FnMut(&mut String, usize, f64, f64)) {
        let x = self.left + self.width + 14.0;
        for (i, label) in labels.iter().enumerate() {
            let y = self.top + 8.0 + i as f64 * 20.0;
            swatch(&mut self.out, i, x, y);
            let _ = writeln!(
                self.out,
                "<text x=\"{:.2}\" y=\"{:.2}\">{}</text>",
                x + 34.0,
                y + 4.0,
                escape(label)
            );
        }
    }

    fn finish(mut self) -> String {
        self.out.push_str("</svg>\n");
        self.out
    }
}

/// Width reserved for a legend with these labels (rough glyph width estimate).
fn legend_width(labels: &[&str]) -> f64 {
    if labels.is_empty() {
        return 0.0;
    }
    let longest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    (48.0 + 7.0 * longest as f64).min(260.0)
}

/// The stroke attributes of line series `i`.
fn line_style(i: usize) -> String {
    let color = COLORS[i % COLORS.len()];
    let dash = DASHES[i % DASHES.len()];
    if dash.is_empty() {
        format!("stroke=\"{color}\" stroke-width=\"2\" fill=\"none\"")
    } else {
        format!("stroke=\"{color}\" stroke-width=\"2\" fill=\"none\" stroke-dasharray=\"{dash}\"")
    }
}

/// A marker of shape `i` (circle, square, triangle, diamond, cross, plus) centred at (x, y).
fn marker(out: &mut String, i: usize, x: f64, y: f64) {
    let c = COLORS[i % COLORS.len()];
    let _ = match i % 6 {
        0 => writeln!(
            out,
            "<circle cx=\"{x:.2}\" cy=\"{y:.2}\" r=\"3.5\" fill=\"{c}\"/>"
        ),
        1 => writeln!(
            out,
            "<rect x=\"{:.2}\" y=\"{:.2}\" width=\"7\" height=\"7\" fill=\"{c}\"/>",
            x - 3.5,
            y - 3.5
        ),
        2 => writeln!(
            out,
            "<path d=\"M{x:.2} {:.2}L{:.2} {:.2}L{:.2} {:.2}Z\" fill=\"{c}\"/>",
            y - 4.5,
            x + 4.5,
            y + 3.5,
            x - 4.5,
            y + 3.5
        ),
        3 => writeln!(
            out,
            "<path d=\"M{x:.2} {:.2}L{:.2} {y:.2}L{x:.2} {:.2}L{:.2} {y:.2}Z\" fill=\"white\" \
             stroke=\"{c}\" stroke-width=\"1.5\"/>",
            y - 4.5,
            x + 4.5,
            y + 4.5,
            x - 4.5
        ),
        4 => writeln!(
            out,
            "<path d=\"M{:.2} {:.2}L{:.2} {:.2}M{:.2} {:.2}L{:.2} {:.2}\" stroke=\"{c}\" \
             stroke-width=\"2\"/>",
            x - 4.0,
            y - 4.0,
            x + 4.0,
            y + 4.0,
            x - 4.0,
            y + 4.0,
            x + 4.0,
            y - 4.0
        ),
        _ => writeln!(
            out,
            "<path d=\"M{:.2} {y:.2}L{:.2} {y:.2}M{x:.2} {:.2}L{x:.2} {:.2}\" stroke=\"{c}\" \
             stroke-width=\"2\"/>",
            x - 4.5,
            x + 4.5,
            y - 4.5,
            y + 4.5
        ),
    };
}

fn finite(p: &(f64, f64)) -> bool {
    p.0.is_finite() && p.1.is_finite()
}

/// Shared body of [`line_plot`] and [`step_plot`].
fn xy_plot(title: &str, x_label: &str, y_label: &str, series: &[Series], steps: bool) -> String {
    let labels: Vec<&str> = series.iter().map(|s| s.label.as_str()).collect();
    let mut c = Canvas::new(title, legend_width(&labels));
    let all = || {
        series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|p| finite(p))
    };
    let has_data = all().next().is_some();
    let xa = Axis::new(all().map(|p| p.0), false);
    let ya = Axis::new(all().map(|p| p.1), steps);
    c.y_axis(&ya, y_label);
    c.x_axis(&xa, x_label);
    if !has_data {
        c.no_data();
    }
    let _ = writeln!(
        c.out,
        "<clipPath id=\"plot-area\"><rect x=\"{:.2}\" y=\"{:.2}\" width=\"{:.2}\" \
         height=\"{:.2}\"/></clipPath>",
        c.left, c.top, c.width, c.height
    );
    for (i, s) in series.iter().enumerate() {
        let mut d = String::new();
        let mut pen_down = false;
        for p in &s.points {
            if !finite(p) {
                pen_down = false;
                continue;
            }
            let (x, y) = (c.x(xa.frac(p.0)), c.y(ya.frac(p.1)));
            if !pen_down {
                let _ = write!(d, "M{x:.2} {y:.2}");
                pen_down = true;
            } else if steps {
                let _ = write!(d, "H{x:.2}V{y:.2}");
            } else {
                let _ = write!(d, "L{x:.2} {y:.2}");
            }
        }
        if !d.is_empty() {
            let _ = writeln!(
                c.out,
                "<path d=\"{d}\" {} clip-path=\"url(#plot-area)\"><title>{}</title></path>",
                line_style(i),
                escape(&s.label)
            );
        }
        let finite_points = s.points.iter().filter(|p| finite(p)).count();
        if !steps && finite_points <= MAX_MARKED_POINTS {
            for p in s.points.iter().filter(|p| finite(p)) {
                let (x, y) = (c.x(xa.frac(p.0)), c.y(ya.frac(p.1)));
                marker(&mut c.out, i, x, y);
            }
        }
    }
    c.frame();
    let marked: Vec<bool> = series
        .iter()
        .map(|s| !steps && s.points.iter().filter(|p| finite(p)).count() <= MAX_MARKED_POINTS)
        .collect();
    c.legend(&labels, |out, i, x, y| {
        let _ = writeln!(
            out,
            "<path d=\"M{x:.2} {y:.2}H{:.2}\" {}/>",
            x + 28.0,
            line_style(i)
        );
        if marked[i] {
            marker(out, i, x + 14.0, y);
        }
    });
    c.finish()
}

/// A line plot of `series` over numeric x and y axes with ticks, labels and a legend.
///
/// Series with at most 40 points also get markers (a distinct shape per series). Non-finite
/// points break the line; an empty plot shows "no data".
pub fn line_plot(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    xy_plot(title, x_label, y_label, series, false)
}

/// Like [`line_plot`], but each series is a step function: the value of a point holds until the
/// next point's x (e.g. availability over a week). The y axis always includes 0.
pub fn step_plot(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    xy_plot(title, x_label, y_label, series, true)
}

/// SVG `<pattern>` definitions for bar series: solid, then hatches that survive grayscale.
fn bar_patterns(out: &mut String, count: usize) {
    out.push_str("<defs>\n");
    for i in 0..count {
        let color = COLORS[i % COLORS.len()];
        let body = match i % 6 {
            0 => format!("<rect width=\"8\" height=\"8\" fill=\"{color}\"/>"),
            1 => format!(
                "<rect width=\"8\" height=\"8\" fill=\"white\"/><path d=\"M0 8L8 0M-2 2L2 -2M6 \
                 10L10 6\" stroke=\"{color}\" stroke-width=\"2\"/>"
            ),
            2 => format!(
                "<rect width=\"8\" height=\"8\" fill=\"{color}\" fill-opacity=\"0.35\"/>\
                 <circle cx=\"4\" cy=\"4\" r=\"1.6\" fill=\"{color}\"/>"
            ),
            3 => format!(
                "<rect width=\"8\" height=\"8\" fill=\"white\"/><path d=\"M0 0L8 8M0 8L8 0\" \
                 stroke=\"{color}\" stroke-width=\"1.2\"/>"
            ),
            4 => format!(
                "<rect width=\"8\" height=\"8\" fill=\"white\"/><path d=\"M0 4H8\" \
                 stroke=\"{color}\" stroke-width=\"2.5\"/>"
            ),
            _ => format!(
                "<rect width=\"8\" height=\"8\" fill=\"white\"/><path d=\"M4 0V8\" \
                 stroke=\"{color}\" stroke-width=\"2.5\"/>"
            ),
        };
        let _ = writeln!(
            out,
            "<pattern id=\"bar{i}\" width=\"8\" height=\"8\" patternUnits=\"userSpaceOnUse\">\
             {body}</pattern>"
        );
    }
    out.push_str("</defs>\n");
}

/// A grouped bar chart: one cluster per entry of `groups`, one bar per series in each cluster
/// (`series[k].1[g]` is series `k`'s value in group `g`). The y axis always includes 0; negative
/// values hang down from 0. Missing (short vectors) and non-finite values leave a gap.
pub fn bar_chart(
    title: &str,
    y_label: &str,
    groups: &[String],
    series: &[(String, Vec<f64>)],
) -> String {
    let labels: Vec<&str> = series.iter().map(|s| s.0.as_str()).collect();
    let mut c = Canvas::new(title, legend_width(&labels));
    let value = |k: usize, g: usize| series[k].1.get(g).copied().filter(|v| v.is_finite());
    let values =
        || (0..series.len()).flat_map(move |k| (0..groups.len()).filter_map(move |g| value(k, g)));
    let has_data = values().next().is_some();
    let ya = Axis::new(values(), true);
    bar_patterns(&mut c.out, series.len());
    c.y_axis(&ya, y_label);
    if !has_data {
        c.no_data();
    }
    let slot = c.width / groups.len().max(1) as f64;
    let bar = slot * 0.8 / series.len().max(1) as f64;
    let zero = c.y(ya.frac(0.0));
    let bottom = c.top + c.height;
    let rotate = groups.len() > 8;
    for (g, name) in groups.iter().enumerate() {
        let x0 = c.left + g as f64 * slot + slot * 0.1;
        for k in 0..series.len() {
            let Some(v) = value(k, g) else { continue };
            let y = c.y(ya.frac(v));
            let (top, h) = if y < zero {
                (y, zero - y)
            } else {
                (zero, y - zero)
            };
            let _ = writeln!(
                c.out,
                "<rect x=\"{:.2}\" y=\"{top:.2}\" width=\"{:.2}\" height=\"{h:.2}\" \
                 fill=\"url(#bar{k})\" stroke=\"{}\"><title>{}: {}</title></rect>",
                x0 + k as f64 * bar,
                bar.max(0.5),
                COLORS[k % COLORS.len()],
                escape(&series[k].0),
                escape(&format_number(v, v.abs().max(1e-12) / 1000.0))
            );
        }
        let cx = c.left + (g as f64 + 0.5) * slot;
        if rotate {
            let _ = writeln!(
                c.out,
                "<text x=\"{cx:.2}\" y=\"{:.2}\" text-anchor=\"end\" transform=\"rotate(-30 \
                 {cx:.2} {:.2})\">{}</text>",
                bottom + 14.0,
                bottom + 14.0,
                escape(name)
            );
        } else {
            let _ = writeln!(
                c.out,
                "<text x=\"{cx:.2}\" y=\"{:.2}\" text-anchor=\"middle\">{}</text>",
                bottom + 18.0,
                escape(name)
            );
        }
    }
    let _ = writeln!(
        c.out,
        "<line x1=\"{:.2}\" y1=\"{zero:.2}\" x2=\"{:.2}\" y2=\"{zero:.2}\" stroke=\"black\"/>",
        c.left,
        c.left + c.width
    );
    c.frame();
    c.legend(&labels, |out, k, x, y| {
        let _ = writeln!(
            out,
            "<rect x=\"{x:.2}\" y=\"{:.2}\" width=\"28\" height=\"12\" fill=\"url(#bar{k})\" \
             stroke=\"{}\"/>",
            y - 6.0,
            COLORS[k % COLORS.len()]
        );
    });
    c.finish()
}

#[cfg(test)]
mod tests;
