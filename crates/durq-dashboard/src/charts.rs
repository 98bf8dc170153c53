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
    // Each line keeps the colour of its place in `series` (sorted by queue), so a
    // queue has the same colour in every chart; the busiest lines are the ones kept.
    let mut lines: Vec<(&str, &Series)> = series
        .iter()
        .enumerate()
        .map(|(i, line)| (PALETTE[i % PALETTE.len()], line))
        .collect();
    lines.sort_by(|a, b| b.1.peak().total_cmp(&a.1.peak()));
    let left_out = lines.len().saturating_sub(MAX_LINES);
    lines.truncate(MAX_LINES);
    let peak = lines.iter().map(|(_, s)| s.peak()).fold(0.0, f64::max);
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
                svg class="plot" xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (WIDTH) " " (HEIGHT) }
                    role="img" aria-label=(label) {
                    title { (label) }
                    @for step in 0..=2 {
                        @let value = top * f64::from(step) / 2.0;
                        line class="grid" x1=(LEFT) x2=(WIDTH - RIGHT) y1=(y(value)) y2=(y(value))
                            stroke="#d0d7de" stroke-width="1" {}
                        text x=(LEFT - 6.0) y=(y(value) + 4.0) text-anchor="end" font-size="11"
                            fill="#57606a" { (format::number(value)) }
                    }
                    @for (t, text) in x_ticks(window) {
                        text x=(x(t)) y=(HEIGHT - 6.0) font-size="11" fill="#57606a"
                            text-anchor=(if t <= -window { "start" } else if t >= 0.0 { "end" } else { "middle" }) { (text) }
                    }
                    @for (colour, line) in &lines {
                        @if let [(t, v)] = line.points.as_slice() {
                            circle cx=(x(*t)) cy=(y(*v)) r="3" fill=(colour) {}
                        } @else {
                            polyline fill="none" stroke=(colour) stroke-width="2"
                                stroke-linejoin="round" points=(points(&line.points, x, y)) {}
                        }
                    }
                }
                ul class="legend" {
                    @for (colour, line) in &lines {
                        li {
                            svg xmlns="http://www.w3.org/2000/svg" width="12" height="12"
                                viewBox="0 0 12 12" aria-hidden="true" {
                                rect width="12" height="12" rx="2" fill=(colour) {}
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

/// The labels under the x axis: now, and every round step back to the window's start
/// (at most four steps).
fn x_ticks(window: f64) -> Vec<(f64, String)> {
    const STEPS: [f64; 14] = [
        5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 10800.0,
        21600.0,
    ];
    let step = STEPS
        .into_iter()
        .find(|step| window / step <= 4.0 + 1e-9)
        .unwrap_or(window / 4.0);
    let mut ticks = vec![(0.0, "now".to_owned())];
    let mut back = step;
    while back <= window + 1e-9 {
        let text = if step >= 3600.0 {
            format!("−{} h", format::number(back / 3600.0))
        } else if step >= 60.0 {
            format!("−{} min", format::number(back / 60.0))
        } else {
            format!("−{} s", format::number(back))
        };
        ticks.push((-back, text));
        back += step;
    }
    ticks
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
        assert!(svg.contains("−15 min") && svg.contains("−5 min"), "{svg}");
        let empty = line_chart("Lag", "s", &[], 900.0).into_string();
        assert!(empty.contains("Collecting samples"), "{empty}");
    }

    #[test]
    fn ticks_fall_on_round_steps() {
        let texts = |window: f64| -> Vec<String> {
            x_ticks(window).into_iter().map(|(_, text)| text).collect()
        };
        assert_eq!(texts(20.0), ["now", "−5 s", "−10 s", "−15 s", "−20 s"]);
        assert_eq!(texts(900.0), ["now", "−5 min", "−10 min", "−15 min"]);
        assert_eq!(
            texts(3600.0),
            ["now", "−15 min", "−30 min", "−45 min", "−60 min"]
        );
        assert_eq!(texts(6.0 * 3600.0), ["now", "−2 h", "−4 h", "−6 h"]);
    }

    #[test]
    fn a_queue_keeps_its_colour_whatever_its_rank() {
        let line = |name: &str, v: f64| Series {
            name: name.into(),
            points: vec![(-5.0, v), (0.0, v)],
        };
        let busy_a = line_chart("T", "u", &[line("a", 9.0), line("b", 1.0)], 60.0).into_string();
        let busy_b = line_chart("T", "u", &[line("a", 1.0), line("b", 9.0)], 60.0).into_string();
        for svg in [busy_a, busy_b] {
            let a = svg.find(" a<").expect("a's legend");
            let b = svg.find(" b<").expect("b's legend");
            let colour_before = |at: usize| svg[..at].rfind("fill=\"#").map(|i| &svg[i..i + 14]);
            assert_eq!(
                colour_before(a),
                Some(&format!("fill=\"{}\"", PALETTE[0])[..])
            );
            assert_eq!(
                colour_before(b),
                Some(&format!("fill=\"{}\"", PALETTE[1])[..])
            );
        }
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
