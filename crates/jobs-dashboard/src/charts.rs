//! Line charts as inline SVG, drawn on the server from the samples of
//! [`crate::history`]: no script, no image files.

use std::fmt::Write as _;

use maud::{html, Markup};

use crate::format;
use crate::history::Series;

/// The most lines one chart draws; the busiest queues are kept.
pub(crate) const MAX_LINES: usize = 8;

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 180.0;
const LEFT: f64 = 52.0;
const RIGHT: f64 = 10.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 24.0;

/// Colours of the lines, told apart in colour and in grey.
const PALETTE: [&str; MAX_LINES] = [
    "#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a7c8c", "#57606a",
];

/// A chart of `series` over the last `window_secs` seconds, values in `unit`.
pub(crate) fn line_chart(title: &str, unit: &str, series: &[Series], window_secs: f64) -> Markup {
    let mut lines: Vec<&Series> = series.iter().collect();
    // The busiest first, so the lines kept are the ones worth seeing.
    lines.sort_by(|a, b| b.peak().total_cmp(&a.peak()));
    let left_out = lines.len().saturating_sub(MAX_LINES);
    lines.truncate(MAX_LINES);
    let peak = lines.iter().map(|s| s.peak()).fold(0.0, f64::max);
    let top = nice_ceiling(peak);
    let window = window_secs.max(1.0);
    let x = |t: f64| LEFT + (t + window).clamp(0.0, window) / window * (WIDTH - LEFT - RIGHT);
    let y = |v: f64| TOP + (1.0 - (v / top).clamp(0.0, 1.0)) * (HEIGHT - TOP - BOTTOM);
    let label = format!("{title}, {unit}");
    html! {
        figure class="chart" {
            figcaption { (title) span class="unit" { " (" (unit) ")" } }
            @if lines.is_empty() {
                p class="empty" { "Collecting samples: the first points appear within seconds." }
            } @else {
                svg xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (WIDTH) " " (HEIGHT) }
                    role="img" aria-label=(label) {
                    title { (label) }
                    @for step in 0..=2 {
                        @let value = top * f64::from(step) / 2.0;
                        line class="grid" x1=(LEFT) x2=(WIDTH - RIGHT) y1=(y(value)) y2=(y(value))
                            stroke="#d0d7de" stroke-width="1" {}
                        text x=(LEFT - 6.0) y=(y(value) + 4.0) text-anchor="end" font-size="11"
                            fill="#57606a" { (format::number(value)) }
                    }
                    @for (i, tick) in x_ticks(window).iter().enumerate() {
                        text x=(x(tick.0)) y=(HEIGHT - 6.0) font-size="11" fill="#57606a"
                            text-anchor=(if i == 0 { "start" } else { "middle" }) { (tick.1) }
                    }
                    @for (i, line) in lines.iter().enumerate() {
                        @let colour = PALETTE[i % PALETTE.len()];
                        @if line.points.len() == 1 {
                            @let (t, v) = line.points[0];
                            circle cx=(x(t)) cy=(y(v)) r="3" fill=(colour) {}
                        } @else {
                            polyline fill="none" stroke=(colour) stroke-width="2"
                                stroke-linejoin="round" points=(points(&line.points, x, y)) {}
                        }
                    }
                }
                ul class="legend" {
                    @for (i, line) in lines.iter().enumerate() {
                        li {
                            svg xmlns="http://www.w3.org/2000/svg" width="12" height="12"
                                viewBox="0 0 12 12" aria-hidden="true" {
                                rect width="12" height="12" rx="2" fill=(PALETTE[i % PALETTE.len()]) {}
                            }
                            " " (line.name)
                            span class="muted" { " peak " (format::number(line.peak())) }
                        }
                    }
                    @if left_out > 0 {
                        li class="muted" { "and " (left_out) " quieter queues" }
                    }
                }
            }
        }
    }
}

/// `x,y x,y …` for a polyline.
fn points(points: &[(f64, f64)], x: impl Fn(f64) -> f64, y: impl Fn(f64) -> f64) -> String {
    let mut out = String::with_capacity(points.len() * 14);
    for &(t, v) in points {
        let _ = write!(out, "{:.1},{:.1} ", x(t), y(v));
    }
    out.trim_end().to_owned()
}

/// The labels under the x axis: the start of the window, two marks between, and now.
fn x_ticks(window: f64) -> Vec<(f64, String)> {
    (0..=3)
        .map(|i| {
            let t = -window * f64::from(3 - i) / 3.0;
            let text = if i == 3 {
                "now".to_owned()
            } else if window >= 120.0 {
                format!("−{} min", format::number(-t / 60.0))
            } else {
                format!("−{} s", format::number(-t))
            };
            (t, text)
        })
        .collect()
}

/// The smallest of 1, 2, 5 × 10ⁿ at or above `value` (1 for nothing).
fn nice_ceiling(value: f64) -> f64 {
    if !value.is_finite() || value <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|&step| step >= value * (1.0 - 1e-9))
        .unwrap_or(10.0 * magnitude)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_are_round() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(0.3), 0.5);
        assert_eq!(nice_ceiling(1.0), 1.0);
        assert_eq!(nice_ceiling(1.1), 2.0);
        assert_eq!(nice_ceiling(37.0), 50.0);
        assert_eq!(nice_ceiling(600.0), 1000.0);
    }

    #[test]
    fn a_chart_draws_one_line_per_queue_and_escapes_names() {
        let series = vec![
            Series {
                name: "a<b".into(),
                points: vec![(-10.0, 1.0), (0.0, 3.0)],
            },
            Series {
                name: "single".into(),
                points: vec![(0.0, 2.0)],
            },
        ];
        let svg = line_chart("Throughput", "jobs/s", &series, 900.0).into_string();
        assert_eq!(svg.matches("<polyline").count(), 1, "{svg}");
        assert_eq!(svg.matches("<circle").count(), 1, "{svg}");
        assert!(svg.contains("a&lt;b"), "{svg}");
        assert!(!svg.contains("a<b"), "{svg}");
        assert!(svg.contains("−15 min"), "{svg}");
        let empty = line_chart("Lag", "s", &[], 900.0).into_string();
        assert!(empty.contains("Collecting samples"), "{empty}");
    }

    #[test]
    fn only_the_busiest_lines_are_drawn() {
        let series: Vec<Series> = (0..12)
            .map(|i| Series {
                name: format!("q{i}"),
                points: vec![(-5.0, f64::from(i)), (0.0, f64::from(i))],
            })
            .collect();
        let svg = line_chart("Throughput", "jobs/s", &series, 900.0).into_string();
        assert_eq!(svg.matches("<polyline").count(), MAX_LINES);
        assert!(svg.contains("q11") && !svg.contains(">q0<") && !svg.contains(" q0"));
        assert!(svg.contains("and 4 quieter queues"), "{svg}");
    }
}
