//! The replay chart (SVG or PNG via `plotters`): one panel per policy with demand, ready
//! replicas and the plan (replicas, left axis), the backlog (requests, right axis), and a
//! strip along the bottom marking when requests were late (bar height: the share late).
//! A PNG is rasterised with DejaVu Sans embedded in the binary (the `dejavu` crate), so it
//! has its text on a machine without fonts (the container image has none).

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;
use prescale_forecaster::SimResult;

use super::Summary;

/// At most this many points per series (about one per pixel column of the plotting area).
const MAX_POINTS: usize = 1500;

/// One point of a downsampled series: the bucket's first x, and the smallest, mean and
/// largest y of the samples in it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bucket {
    x: f64,
    lo: f64,
    mean: f64,
    hi: f64,
}

/// Downsample to at most [`MAX_POINTS`] buckets of consecutive samples (equally spaced, as
/// the replay's per-decision series are). A bucket keeps its mean, which is what the fleet
/// costs over it, and its range, which keeps every peak: on a 14-day replay a bucket spans
/// about 13 minutes, and the planner's margin pulses (replicas ordered for a change point and
/// released after it) would draw a line at the pulse's top if the bucket's maximum stood for
/// it (before session 27 it did, and the plan looked twice the demand on calm days when its
/// mean was 1.4× it).
fn buckets(xs: &[f64], ys: &[f64]) -> Vec<Bucket> {
    let n = xs.len().min(ys.len());
    let per = bucket_len(n);
    (0..n)
        .step_by(per)
        .map(|i| {
            let ys = &ys[i..(i + per).min(n)];
            let (lo, hi) = ys.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &y| (l.min(y), h.max(y)));
            Bucket { x: xs[i], lo, mean: ys.iter().sum::<f64>() / ys.len() as f64, hi }
        })
        .collect()
}

/// Samples per bucket for a series of `n` (1 where it has at most [`MAX_POINTS`]).
fn bucket_len(n: usize) -> usize {
    n.div_ceil(MAX_POINTS).max(1)
}

/// The bucket maxima (the backlog is drawn by its peaks: a queue that formed is the news).
fn maxima(b: &[Bucket]) -> Vec<(f64, f64)> {
    b.iter().map(|b| (b.x, b.hi)).collect()
}

/// The bucket means.
fn means(b: &[Bucket]) -> Vec<(f64, f64)> {
    b.iter().map(|b| (b.x, b.mean)).collect()
}

/// The closed outline of the buckets' ranges (highs left to right, lows back), or nothing
/// where no bucket has a range to show (fewer samples than points: every bucket is one).
fn band(b: &[Bucket]) -> Vec<(f64, f64)> {
    if b.iter().all(|b| b.hi - b.lo < 1e-9) {
        return Vec::new();
    }
    b.iter().map(|b| (b.x, b.hi)).chain(b.iter().rev().map(|b| (b.x, b.lo))).collect()
}

/// Height of the late strip, as a share of the left axis. It lies along the bottom, over the
/// lines (the legend covers the top left of the first panel).
const LATE_STRIP: f64 = 0.1;
/// The late strip's colour (solid: a bar is a fact, not a shade).
const LATE_COLOR: RGBColor = RGBColor(140, 0, 26);

/// The late strip: per bucket of decisions (as [`buckets`] groups them), `(x from, x to,
/// share of the bucket's arrivals that were late)`, for buckets with any late arrival.
fn late_shares(xs: &[f64], late: &[f64], arrivals: &[f64], x_end: f64) -> Vec<(f64, f64, f64)> {
    let n = xs.len().min(late.len()).min(arrivals.len());
    let per = bucket_len(n);
    (0..n)
        .step_by(per)
        .filter_map(|i| {
            let j = (i + per).min(n);
            let (l, a): (f64, f64) = (late[i..j].iter().sum(), arrivals[i..j].iter().sum());
            let to = xs.get(j).copied().unwrap_or(x_end);
            (l > 0.0 && a > 0.0).then(|| (xs[i], to, (l / a).clamp(0.0, 1.0)))
        })
        .collect()
}

/// Whether `path` asks for a PNG (by its extension, any case); anything else is SVG.
pub fn is_png(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("png"))
}

/// Register the embedded font for the text of every backend (once per process).
fn fonts() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
                .map_err(|_| "the embedded chart font does not load".to_string())
        })
        .clone()
}

/// Draw the chart to `path`: a PNG if it ends in `.png`, else an SVG.
pub fn draw(path: &Path, s: &Summary, results: &[SimResult]) -> Result<(), String> {
    fonts()?;
    let size = (1400, 330 * results.len().max(1) as u32);
    if is_png(path) {
        draw_on(BitMapBackend::new(path, size).into_drawing_area(), s, results, Lines::Segments)
    } else {
        draw_on(SVGBackend::new(path, size).into_drawing_area(), s, results, Lines::Polyline)
    }
}

/// How a 2-px series is stroked. The bitmap backend strokes a wide polyline as one polygon
/// with mitred joins, and where a series jumps from 0 to its peak and back within a pixel
/// (a sparse client's bursts) the miter of that near-reversal reaches far outside the chart,
/// across the other panels (plotters issue #549). Stroked as separate segments there are no
/// joins to mitre; the SVG backend leaves the joins to the renderer and keeps one polyline.
#[derive(Clone, Copy, PartialEq)]
enum Lines {
    Polyline,
    Segments,
}

fn draw_on<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    s: &Summary,
    results: &[SimResult],
    lines: Lines,
) -> Result<(), String> {
    let n = results.len().max(1);
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((n, 1));
    let interval = s.scenario.interval as f64;
    let mu = s.scenario.capacity;
    // Each panel's demand, ready fleet and plan, in replicas.
    let fleets: Vec<[Vec<f64>; 3]> = results
        .iter()
        .map(|r| {
            [
                r.arrivals.iter().map(|a| a / interval / mu).collect(),
                r.ready.iter().map(|x| f64::from(*x)).collect(),
                r.plan.iter().map(|(_, d)| f64::from(*d)).collect(),
            ]
        })
        .collect();
    // One replica scale for every panel, so the policies' fleets compare at a glance (the
    // backlog keeps its own right-hand scale: it spans orders of magnitude between them).
    let y_max = fleets.iter().flatten().flatten().copied().fold(1.0, f64::max) * 1.1;
    // One legend, on the first panel (the series are the same in every panel; the others stay
    // unobstructed), with the late bars' entry when any panel has them.
    let any_late = results.iter().any(|r| r.late.iter().any(|l| *l > 0.0));
    for (k, (panel, ((res, row), [demand, ready, plan]))) in
        panels.iter().zip(results.iter().zip(&s.policies).zip(&fleets)).enumerate()
    {
        let legend = k == 0;
        let hours: Vec<f64> = res.plan.iter().map(|(t, _)| *t as f64 / 3600.0).collect();
        let backlog: Vec<f64> = res.backlog_max.clone();
        let x_max = hours.last().copied().unwrap_or(1.0).max(1e-3) + interval / 3600.0;
        let b_max = backlog.iter().copied().fold(1.0, f64::max) * 1.1;
        let caption = format!(
            "{} — SLO attainment {:.2}% ({:.2}% late on cold starts), {:.1} GPU-h ({:.2}× oracle), {} starts",
            row.policy,
            row.slo_attainment * 100.0,
            row.cold_start_miss * 100.0,
            row.gpu_hours,
            row.cost_vs_oracle,
            row.replica_starts
        );
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(32)
            .y_label_area_size(56)
            .right_y_label_area_size(70)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(|e| e.to_string())?
            .set_secondary_coord(0f64..x_max, 0f64..b_max);
        chart
            .configure_mesh()
            .x_desc("hours")
            .y_desc("replicas")
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| e.to_string())?;
        chart.configure_secondary_axes().y_desc("backlog (requests)").draw().map_err(|e| e.to_string())?;
        let backlog_color = RGBColor(214, 39, 40);
        chart
            .draw_secondary_series(AreaSeries::new(maxima(&buckets(&hours, &backlog)), 0.0, backlog_color.mix(0.25)))
            .map_err(|e| e.to_string())?
            .label("backlog (right)")
            .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 18, y + 4)], backlog_color.mix(0.35).filled()));
        let series: [(&str, &Vec<f64>, RGBColor); 3] = [
            ("demand (replica-equivalents)", demand, RGBColor(127, 127, 127)),
            ("ready replicas", ready, RGBColor(31, 119, 180)),
            ("plan (desired)", plan, RGBColor(255, 127, 14)),
        ];
        let bucketed: Vec<Vec<Bucket>> = series.iter().map(|(_, ys, _)| buckets(&hours, ys)).collect();
        // What one drawn point spans, for the legend (e.g. "13.5 min" on a 14-day replay).
        let per = bucket_len(hours.len());
        let span_s = per as f64 * interval;
        let span = if span_s >= 3600.0 {
            format!("{:.1} h", span_s / 3600.0)
        } else if span_s >= 60.0 {
            format!("{:.1} min", span_s / 60.0)
        } else {
            format!("{span_s:.0} s")
        };
        // The plan's and the ready fleet's ranges within each bucket, under every line.
        for ((label, _, color), b) in series.iter().zip(&bucketed).skip(1) {
            let outline = band(b);
            if outline.is_empty() {
                continue;
            }
            let fill = color.mix(0.18);
            chart
                .draw_series(std::iter::once(Polygon::new(outline, fill.filled())))
                .map_err(|e| e.to_string())?
                .label(format!("{label}: min–max per {span}"))
                .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 18, y + 4)], fill.filled()));
        }
        for ((label, _, color), b) in series.iter().zip(&bucketed) {
            let (label, color) = (*label, *color);
            let style = color.stroke_width(if label.starts_with("demand") { 1 } else { 2 });
            let points = means(b);
            let drawn = if lines == Lines::Segments {
                chart.draw_series(points.windows(2).map(|p| PathElement::new(vec![p[0], p[1]], style)))
            } else {
                chart.draw_series(LineSeries::new(points, style))
            };
            let label = if per > 1 { format!("{label}: mean per {span}") } else { label.to_string() };
            drawn
                .map_err(|e| e.to_string())?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        }
        // Over the lines: a late bucket is often where a line climbs steeply out of zero, and
        // a bar under it would be hidden by the line's stroke.
        let late = late_shares(&hours, &res.late, &res.arrivals, x_max);
        if !late.is_empty() || (legend && any_late) {
            let h = LATE_STRIP * y_max;
            // At least two pixels wide (the plotting area is about 1,250 px), so one late
            // bucket among a thousand still shows.
            let min_w = x_max * 2.0 / 1250.0;
            chart
                .draw_series(late.iter().map(|&(x0, x1, share)| {
                    // At least a few pixels high, so a rare late second still shows.
                    Rectangle::new([(x0, 0.0), (x1.max(x0 + min_w), h * share.max(0.15))], LATE_COLOR.filled())
                }))
                .map_err(|e| e.to_string())?
                .label(format!("late requests (bars along the bottom; taller: a larger share late per {span})"))
                .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 18, y + 4)], LATE_COLOR.filled()));
        }
        if legend {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .draw()
                .map_err(|e| e.to_string())?;
        }
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::replay::{replay, ReplayOptions, Which};

    /// A sparse client: 3 days of 10-minute windows, mostly idle, with short bursts of very
    /// different heights (a series that swings between 0 and its peak from one point to the
    /// next, as `servegen-m-large-chunk-93` does).
    fn spiky_trace() -> String {
        let mut text = String::from("window_start_s,rate_rps\n");
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for k in 0..432u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let rate = if x.is_multiple_of(5) { (x >> 20) % 2000 } else { 0 } as f64 / 100.0;
            text.push_str(&format!("{},{rate}\n", k * 600));
        }
        text
    }

    /// A plan that pulses (8 replicas, 16 for a quarter of each 10-minute window, as margin
    /// replicas ordered for a change point do) is drawn at its mean with its range as a band,
    /// not at the pulses' top; a short series is drawn as it is.
    #[test]
    fn a_pulsing_plan_is_drawn_at_its_mean_with_its_range_as_a_band() {
        let n = 14 * 86400 / 15;
        let xs: Vec<f64> = (0..n).map(|k| k as f64 * 15.0 / 3600.0).collect();
        let ys: Vec<f64> = (0..n).map(|k| if k % 40 < 10 { 16.0 } else { 8.0 }).collect();
        let b = super::buckets(&xs, &ys);
        assert!(b.len() <= super::MAX_POINTS && b.len() > super::MAX_POINTS / 2, "{} buckets", b.len());
        let total = b.iter().map(|b| b.mean).sum::<f64>() / b.len() as f64;
        assert!((total - 10.0).abs() < 0.1, "mean of the means {total}");
        // Every full bucket (54 decisions, 13.5 minutes) holds a pulse; the last is shorter.
        assert!(b[..b.len() - 1].iter().all(|b| b.lo == 8.0 && b.hi == 16.0 && b.mean > 8.0 && b.mean < 16.0));
        let outline = super::band(&b);
        assert_eq!(outline.len(), 2 * b.len());
        assert_eq!(outline[0], (b[0].x, 16.0));
        assert_eq!(outline[outline.len() - 1], (b[0].x, 8.0));

        let short = super::buckets(&xs[..100], &ys[..100]);
        assert_eq!(short.len(), 100);
        assert!(short.iter().zip(&ys).all(|(b, &y)| b.lo == y && b.mean == y && b.hi == y));
        assert!(super::band(&short).is_empty());
        assert!(super::buckets(&[], &[]).is_empty());
    }

    /// The spiky client replayed at μ 0.25, W 420 s, SLO 5 s by all three policies.
    fn spiky_replay() -> crate::replay::Replayed {
        let trace = crate::replay::load_trace(&spiky_trace()).unwrap();
        let opts = ReplayOptions {
            capacity: 0.25,
            warmup: 420,
            slo: 5.0,
            interval: 15,
            min_replicas: 0,
            max_replicas: None,
            initial_replicas: None,
            policy: Which::All,
            plan_out: None,
            summary_out: None,
            chart: None,
            progress: false,
        };
        replay(&trace, "spiky", &opts).unwrap()
    }

    /// [`spiky_replay`] drawn to a temporary file with extension `ext`: the file's bytes.
    fn spiky_drawn(r: &crate::replay::Replayed, ext: &str) -> Vec<u8> {
        let path = std::env::temp_dir().join(format!(
            "prescale-chart-{}-{:?}.{ext}",
            std::process::id(),
            std::thread::current().id()
        ));
        super::draw(&path, &r.summary, &r.results).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        bytes
    }

    /// [`spiky_replay`] as a PNG: the per-policy attainments, and the image's RGB bytes, width
    /// and height.
    fn spiky_png() -> (Vec<f64>, Vec<u8>, u32, u32) {
        let r = spiky_replay();
        let bytes = spiky_drawn(&r, "png");
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        let att = r.summary.policies.iter().map(|p| p.slo_attainment).collect();
        (att, buf, info.width, info.height)
    }

    /// The left (replica) axis of each panel of an SVG chart: its largest tick label, per
    /// panel from the top (the panels are 330 px high; left-axis labels are right-aligned
    /// at the left edge).
    fn left_axis_tops(svg: &str) -> Vec<f64> {
        let mut tops: Vec<f64> = Vec::new();
        for el in svg.split("<text ").skip(1) {
            let attr = |name: &str| {
                let from = el.find(&format!("{name}=\"")).map(|i| i + name.len() + 2)?;
                el[from..].split('"').next()?.parse::<f64>().ok()
            };
            let (Some(x), Some(y)) = (attr("x"), attr("y")) else { continue };
            let head = el.split('>').next().unwrap_or_default();
            let body = el.split_once('>').map(|(_, b)| b.split("</text>").next().unwrap_or_default().trim());
            let Some(v) = body.and_then(|b| b.parse::<f64>().ok()) else { continue };
            if x < 60.0 && head.contains("text-anchor=\"end\"") {
                let panel = (y / 330.0) as usize;
                if tops.len() <= panel {
                    tops.resize(panel + 1, f64::NEG_INFINITY);
                }
                tops[panel] = tops[panel].max(v);
            }
        }
        tops
    }

    /// Every panel draws replicas on one scale, so the policies' fleets compare at a glance,
    /// although here they reach very different peaks; one legend (on the first panel) names
    /// the series for all, the late bars included.
    #[test]
    fn the_panels_share_one_replica_scale_and_one_legend() {
        let r = spiky_replay();
        let peaks: Vec<u32> = r.results.iter().map(|x| x.ready.iter().copied().max().unwrap_or(0)).collect();
        assert!(peaks.iter().max() > peaks.iter().min(), "the policies' peaks differ: {peaks:?}");
        let svg = String::from_utf8(spiky_drawn(&r, "svg")).unwrap();
        let tops = left_axis_tops(&svg);
        assert_eq!(tops.len(), 3, "{tops:?}");
        assert!(tops.iter().all(|t| *t == tops[0] && *t > 0.0), "{tops:?}");
        assert_eq!(svg.matches("demand (replica-equivalents)").count(), 1, "one legend");
        assert_eq!(svg.matches("late requests (bars along the bottom").count(), 1, "its late entry");
    }

    #[test]
    fn late_shares_mark_the_buckets_with_late_arrivals_by_their_share() {
        let xs = [0.0, 1.0, 2.0, 3.0];
        let got = super::late_shares(&xs, &[0.0, 2.0, 0.0, 3.0], &[4.0, 4.0, 0.0, 3.0], 4.0);
        assert_eq!(got, vec![(1.0, 2.0, 0.5), (3.0, 4.0, 1.0)]);
        // Bucketed as the lines are: 3,000 decisions make 1,500 buckets of two.
        let n = 3000;
        let xs: Vec<f64> = (0..n).map(|k| k as f64).collect();
        let mut late = vec![0.0; n];
        late[11] = 1.0;
        let got = super::late_shares(&xs, &late, &vec![2.0; n], n as f64);
        assert_eq!(got, vec![(10.0, 12.0, 0.25)]);
        assert!(super::late_shares(&xs, &vec![0.0; n], &vec![2.0; n], n as f64).is_empty());
    }

    /// The late strip is there in the panels of policies that missed the SLO, and only there.
    #[test]
    fn a_png_marks_late_requests_in_the_panels_of_policies_that_had_them() {
        let (att, buf, w, h) = spiky_png();
        let strip = (super::LATE_COLOR.0, super::LATE_COLOR.1, super::LATE_COLOR.2);
        for (k, a) in att.iter().enumerate() {
            // The lower half of the panel: the bars are along the bottom, the legend (with its
            // late swatch, in the first panel) at the top.
            let marked = (k as u32 * 330 + 165..(k as u32 + 1) * 330)
                .filter(|&y| y < h)
                .flat_map(|y| (0..w).map(move |x| ((y * w + x) * 3) as usize))
                .filter(|&i| (buf[i], buf[i + 1], buf[i + 2]) == strip)
                .count();
            if *a < 1.0 {
                assert!(marked > 0, "panel {k}: attainment {a} but no late strip");
            } else {
                assert_eq!(marked, 0, "panel {k}: attainment {a} yet marked late");
            }
        }
        assert!(att.iter().any(|&a| a < 1.0), "the spiky client should be late somewhere: {att:?}");
    }

    #[test]
    fn a_png_keeps_every_line_inside_its_own_panel() {
        let (_, buf, w, h) = spiky_png();
        assert_eq!(h, 3 * 330);
        // The ready (blue) and plan (orange) lines stay within their panel's plotting area:
        // below the caption, above the x labels, between the axes' label areas.
        let (blue, orange) = ((31u8, 119u8, 180u8), (255u8, 127u8, 14u8));
        let mut outside = Vec::new();
        for y in 0..h {
            for x in 0..w {
                let i = ((y * w + x) * 3) as usize;
                let px = (buf[i], buf[i + 1], buf[i + 2]);
                if px != blue && px != orange {
                    continue;
                }
                let top = y / 330 * 330;
                let inside = (top + 24..top + 330 - 30).contains(&y) && (56..w - 60).contains(&x);
                if !inside {
                    outside.push((x, y));
                }
            }
        }
        assert!(
            outside.is_empty(),
            "{} line pixels outside their panel, e.g. {:?}",
            outside.len(),
            &outside[..outside.len().min(5)]
        );
    }
}
