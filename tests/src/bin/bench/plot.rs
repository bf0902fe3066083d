//! The benchmarks' plots, each as SVG and PNG: distributions as empirical CDFs on a time
//! axis fitted to the data (`cdf`), lines of a cost against a size (`curves`), and the
//! reaction benchmark's p50/p99 bars (`plot`).
//! Text is drawn with DejaVu Sans (Debian's fonts-dejavu-core, which `cargo xtask setup`
//! installs): a PNG has no viewer to lay it out.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use anyhow::anyhow;
use plotters::{coord::Shift, prelude::*};

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// Ten colors a reader tells apart (ColorBrewer's Dark2, then near-black, blue and grey): a
/// reaction plot has up to ten series (five wake modes, two kill paths), and a color used
/// twice makes two of them one.
const COLORS: [RGBColor; 10] = [
    RGBColor(0x1b, 0x9e, 0x77),
    RGBColor(0xd9, 0x5f, 0x02),
    RGBColor(0x75, 0x70, 0xb3),
    RGBColor(0xe7, 0x29, 0x8a),
    RGBColor(0x66, 0xa6, 0x1e),
    RGBColor(0xa6, 0x76, 0x1d),
    RGBColor(0xe6, 0xab, 0x02),
    RGBColor(0x33, 0x33, 0x33),
    RGBColor(0x1f, 0x78, 0xb4),
    RGBColor(0x99, 0x99, 0x99),
];

/// The font every plot's text is laid out with, registered once.
fn font() -> anyhow::Result<()> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let bytes = std::fs::read(FONT)
                .map_err(|e| format!("{FONT}: {e} (install fonts-dejavu-core: `cargo xtask setup`)"))?;
            plotters::style::register_font(
                "sans-serif",
                FontStyle::Normal,
                Box::leak(bytes.into_boxed_slice()),
            )
            .map_err(|_| format!("{FONT}: not a font"))
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

/// One line of a CDF: its label and its samples, in milliseconds.
pub(crate) struct Series {
    pub label: String,
    pub ms: Vec<f64>,
}

/// Empirical CDFs of `series` (the fraction of runs at or below each time), on a log time
/// axis from just below the fastest sample to just above the slowest, written as
/// `<stem>.svg` and `<stem>.png`; the paths written.
pub(crate) fn cdf(series: &[Series], title: &str, stem: &Path) -> anyhow::Result<Vec<PathBuf>> {
    font()?;
    let (svg, png) = (stem.with_extension("svg"), stem.with_extension("png"));
    draw_cdf(SVGBackend::new(&svg, (960, 480)).into_drawing_area(), series, title)?;
    draw_cdf(BitMapBackend::new(&png, (960, 480)).into_drawing_area(), series, title)?;
    Ok(vec![svg, png])
}

/// The time axis: the data's span, widened by a quarter on each side (a log scale); a single
/// value gets a factor of two around it.
fn time_range(series: &[Series]) -> (f64, f64) {
    let all = series.iter().flat_map(|s| s.ms.iter().copied()).filter(|v| *v > 0.0);
    let (lo, hi) = all.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    match (lo, hi) {
        (lo, hi) if lo > hi => (0.1, 1000.0),
        (lo, hi) if hi / lo < 1.5 => (lo / 2.0, hi * 2.0),
        (lo, hi) => (lo / 1.25, hi * 1.25),
    }
}

/// Ticks at 1, 2 and 5 of each decade within `lo..hi`, or at every integer step of the
/// decade when that leaves fewer than four: a log axis ticks only at powers of ten, and a
/// span inside one decade (300–560 ms, say) then has no labelled tick at all.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let decades = lo.log10().floor() as i32..=hi.log10().ceil() as i32;
    let within = |steps: &[f64]| -> Vec<f64> {
        decades
            .clone()
            // Rounded: 3 × 0.1 is 0.30000000000000004, and the label would say so.
            .flat_map(|d| steps.iter().map(move |m| (m * 10f64.powi(d) * 1e9).round() / 1e9))
            .filter(|v| (lo..=hi).contains(v))
            .collect()
    };
    let ticks = within(&[1.0, 2.0, 5.0]);
    if ticks.len() >= 4 { ticks } else { within(&[1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]) }
}

fn draw_cdf<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    series: &[Series],
    title: &str,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    root.fill(&WHITE).map_err(e)?;
    let (lo, hi) = time_range(series);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(50)
        .build_cartesian_2d((lo..hi).log_scale().with_key_points(log_ticks(lo, hi)), 0f64..1.0)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("ms (log scale)")
        .y_desc("fraction of runs")
        .x_label_formatter(&|v| if *v >= 10.0 { format!("{v:.0}") } else { format!("{v}") })
        .draw()
        .map_err(e)?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut ms: Vec<f64> = s.ms.iter().copied().filter(|v| *v > 0.0).collect();
        ms.sort_by(f64::total_cmp);
        let n = ms.len() as f64;
        // A step: each sample lifts the curve by 1/n where it lies.
        let mut points = Vec::with_capacity(ms.len() * 2 + 1);
        points.push((lo, 0.0));
        for (k, v) in ms.iter().enumerate() {
            points.push((*v, k as f64 / n));
            points.push((*v, (k + 1) as f64 / n));
        }
        points.push((hi, 1.0));
        // A series with no sample (the kernel OOM killer first in every run) keeps its legend
        // entry, and draws no line along the axis, where it would hide the others' start.
        let points = if ms.is_empty() { Vec::new() } else { points };
        let label = format!("{} (n={})", s.label, ms.len());
        chart
            .draw_series(std::iter::once(PathElement::new(points, color.stroke_width(2))))
            .map_err(e)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(e)?;
    Ok(())
}

/// The legend every line plot carries, in `position`.
fn draw_legend<'a, DB: DrawingBackend + 'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(|e| anyhow!("{e}"))
}

/// One line of a cost curve: (x, ms) points; p99 lines are drawn dashed.
pub(crate) struct Curve {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

/// Lines of milliseconds (log scale, fitted to the data) against `x_desc` (linear, from 0),
/// a dot at each measured point, as `<stem>.svg` and `<stem>.png`; the paths written.
pub(crate) fn curves(
    curves: &[Curve],
    title: &str,
    x_desc: &str,
    stem: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    font()?;
    let (svg, png) = (stem.with_extension("svg"), stem.with_extension("png"));
    draw_curves(SVGBackend::new(&svg, (960, 540)).into_drawing_area(), curves, title, x_desc)?;
    draw_curves(BitMapBackend::new(&png, (960, 540)).into_drawing_area(), curves, title, x_desc)?;
    Ok(vec![svg, png])
}

fn draw_curves<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    curves: &[Curve],
    title: &str,
    x_desc: &str,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    root.fill(&WHITE).map_err(e)?;
    let x_max = curves.iter().flat_map(|c| c.points.iter().map(|p| p.0)).fold(1.0, f64::max) * 1.05;
    let as_series: Vec<Series> = curves
        .iter()
        .map(|c| Series { label: c.label.clone(), ms: c.points.iter().map(|p| p.1).collect() })
        .collect();
    let (lo, hi) = time_range(&as_series);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..x_max, (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)))
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("ms (log scale)")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| if *v >= 10.0 { format!("{v:.0}") } else { format!("{v}") })
        .draw()
        .map_err(e)?;
    for (i, c) in curves.iter().enumerate() {
        // A p50 and its p99 share a color: pairs follow each other.
        let color = COLORS[(i / 2) % COLORS.len()];
        let style = color.stroke_width(2);
        let points = c.points.iter().copied().filter(|p| p.1 > 0.0);
        let drawn = if c.dashed {
            chart.draw_series(DashedLineSeries::new(points.clone(), 8, 5, style)).map_err(e)?
        } else {
            chart.draw_series(LineSeries::new(points.clone(), style)).map_err(e)?
        };
        let dashed = c.dashed;
        drawn.label(&c.label).legend(move |(x, y)| {
            let end = if dashed { x + 8 } else { x + 16 };
            PathElement::new(vec![(x, y), (end, y)], color.stroke_width(2))
        });
        chart.draw_series(points.map(|p| Circle::new(p, 3, color.filled()))).map_err(e)?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(e)?;
    Ok(())
}

use crate::reaction::{Mode, Percentiles, Row};

/// Bars of p50 detection latency (log scale) per rate and mode, with a tick at p99; cells
/// where the kernel OOM killer always came first are marked with a cross.
pub(crate) fn plot(rows: &[Row], rates: &[u64], modes: &[Mode], path: &Path) -> anyhow::Result<()> {
    font()?;
    let colors = COLORS;
    let root = SVGBackend::new(path, (960, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let groups = rates.len() as f64;
    // The axis spans the data: from under the fastest p50 to over the slowest p99.
    let measured = rows.iter().filter_map(|r| r.detection);
    let (floor, ceiling) =
        measured.fold((f64::MAX, f64::MIN), |(lo, hi), p| (lo.min(p.p50.max(1e-3)), hi.max(p.p99)));
    let (floor, ceiling) = if floor > ceiling { (0.1, 100.0) } else { (floor / 2.0, ceiling * 2.0) };
    let mut chart = ChartBuilder::on(&root)
        .caption("evictd detection latency: p50 bar, p99 tick (ms, log scale)", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..groups - 0.5, (floor..ceiling).log_scale())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(rates.len())
        .x_label_formatter(&|x| {
            let i = x.round();
            match rates.get(i as usize) {
                Some(r) if (x - i).abs() < 1e-6 && i >= 0.0 => format!("{r} MiB/s"),
                _ => String::new(),
            }
        })
        .y_desc("ms")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let slot = 1.0 / (modes.len() as f64 + 1.0);
    for (mi, mode) in modes.iter().enumerate() {
        let color = colors[mi % colors.len()];
        let x0 = |g: usize| g as f64 - 0.5 + slot * (mi as f64 + 0.5);
        let cells: Vec<(usize, Option<Percentiles>)> = rates
            .iter()
            .enumerate()
            .map(|(g, r)| {
                (g, rows.iter().find(|row| row.rate == *r && row.mode == *mode).and_then(|row| row.detection))
            })
            .collect();
        chart
            .draw_series(cells.iter().filter_map(|(g, p)| {
                p.map(|p| Rectangle::new([(x0(*g), floor), (x0(*g) + slot * 0.9, p.p50)], color.filled()))
            }))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(mode.name())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
        chart
            .draw_series(cells.iter().filter_map(|(g, p)| {
                p.map(|p| {
                    PathElement::new(
                        vec![(x0(*g), p.p99), (x0(*g) + slot * 0.9, p.p99)],
                        BLACK.stroke_width(2),
                    )
                })
            }))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .draw_series(cells.iter().filter(|(_, p)| p.is_none()).map(|(g, _)| {
                Text::new(
                    "×",
                    (x0(*g) + slot * 0.3, floor * 1.2),
                    ("sans-serif", 14).into_font().color(&color),
                )
            }))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SVG of a plot written as (SVG, PNG), once the PNG is checked to be one; both
    /// removed unless EVICTD_KEEP_PLOT is set.
    fn svg_of(written: &[PathBuf]) -> String {
        let svg = std::fs::read_to_string(&written[0]).expect("svg");
        let png = std::fs::read(&written[1]).expect("png");
        if std::env::var_os("EVICTD_KEEP_PLOT").is_none() {
            for p in written {
                let _ = std::fs::remove_file(p);
            }
        }
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        svg
    }

    /// The texts of an SVG's `<text>` elements (plotters writes each on a line of its own).
    fn labels(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| Some(t.split_once('>')?.1.split('<').next()?.trim().to_owned()))
            .collect()
    }

    #[test]
    fn a_time_axis_inside_one_decade_still_has_labelled_ticks() {
        assert_eq!(log_ticks(300.0, 560.0), vec![300.0, 400.0, 500.0]);
        assert_eq!(log_ticks(0.3, 70.0), vec![0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0]);
        assert_eq!(log_ticks(0.25, 0.65), vec![0.3, 0.4, 0.5, 0.6]);
    }

    /// A CDF per series, as SVG and PNG, on an axis that spans the data (not a fixed 100 s):
    /// 0.5–40 ms data gives labels within a decade of it.
    #[test]
    fn cdfs_are_written_as_svg_and_png_on_the_datas_axis() {
        let stem = std::env::temp_dir().join(format!("evictd-bench-cdf-{}", std::process::id()));
        let series = [
            Series { label: "ebpf".into(), ms: vec![0.5, 0.7, 0.9, 1.4, 2.5] },
            Series { label: "poll".into(), ms: vec![3.0, 8.0, 40.0] },
        ];
        let svg = svg_of(&cdf(&series, "detection", &stem).expect("cdf"));
        assert!(svg.contains("ebpf (n=5)") && svg.contains("poll (n=3)"), "legend");
        let labels = labels(&svg);
        assert!(labels.iter().any(|l| l == "10" || l == "20"), "labels within the data's span: {labels:?}");
        assert!(!labels.iter().any(|l| l == "100000" || l == "10000"), "no axis to 100 s: {labels:?}");
        let (lo, hi) = time_range(&series);
        assert!(lo > 0.2 && lo < 0.5 && hi > 40.0 && hi < 100.0, "{lo}..{hi}");
    }

    /// Ten series (a reaction's five wake modes by two kill paths) in ten colors; one without
    /// a sample is in the legend all the same.
    #[test]
    fn ten_series_are_ten_colors() {
        let stem = std::env::temp_dir().join(format!("evictd-bench-colors-{}", std::process::id()));
        let mut series: Vec<Series> = (0..9)
            .map(|i| Series { label: format!("mode{i}"), ms: vec![1.0 + i as f64, 2.0 + i as f64] })
            .collect();
        series.push(Series { label: "psi fast".into(), ms: vec![] });
        let svg = svg_of(&cdf(&series, "freed", &stem).expect("cdf"));
        assert!(svg.contains("psi fast (n=0)"), "a series without samples keeps its legend entry");
        let strokes: std::collections::BTreeSet<&str> = svg
            .split("<polyline")
            .skip(1)
            .filter_map(|l| l.split("stroke=\"").nth(1)?.split('"').next())
            .filter(|c| *c != "#000000") // the legend's border
            .collect();
        assert!(strokes.len() >= 10, "ten series, ten colors: {strokes:?}");
    }

    /// A line per curve against N, on a time axis fitted to the data, as SVG and PNG.
    #[test]
    fn cost_curves_are_written_against_their_size() {
        let stem = std::env::temp_dir().join(format!("evictd-bench-curve-{}", std::process::id()));
        let curves = [
            Curve { label: "detection p50".into(), points: vec![(10.0, 0.4), (250.0, 0.5)], dashed: false },
            Curve { label: "detection p99".into(), points: vec![(10.0, 0.9), (250.0, 3.0)], dashed: true },
        ];
        let svg = svg_of(&super::curves(&curves, "cost", "pods on the node", &stem).expect("curves"));
        assert!(svg.contains("detection p50") && svg.contains("detection p99"), "legend");
        let labels = labels(&svg);
        assert!(labels.iter().any(|l| l == "pods on the node"), "{labels:?}");
        assert!(labels.iter().any(|l| l == "250"), "the size axis reaches N: {labels:?}");
        assert!(!labels.iter().any(|l| l == "100.0" || l == "1000.0"), "no time axis to 100 ms: {labels:?}");
        // Most of a decision's times lie below 1 ms: a log axis labelled only at powers of ten
        // leaves them unreadable.
        assert!(labels.iter().any(|l| l == "0.5"), "a labelled tick below 1 ms: {labels:?}");
    }

    #[test]
    fn plot_has_a_bar_per_measured_cell_and_a_cross_per_lost_one() {
        let path = std::env::temp_dir().join(format!("evictd-bench-plot-{}.svg", std::process::id()));
        let p = |ms| Some(Percentiles { p50: ms, p99: ms * 2.0 });
        let rows = [
            Row { rate: 256, mode: Mode::Ebpf, detection: p(0.5) },
            Row { rate: 256, mode: Mode::Poll10s, detection: None },
            Row { rate: 1024, mode: Mode::Ebpf, detection: p(0.7) },
        ];
        plot(&rows, &[256, 1024], &[Mode::Ebpf, Mode::Poll10s], &path).expect("plot");
        let svg = std::fs::read_to_string(&path).expect("svg written");
        if std::env::var_os("EVICTD_KEEP_PLOT").is_none() {
            let _ = std::fs::remove_file(&path);
        }
        assert!(svg.contains("256 MiB/s") && svg.contains("1024 MiB/s"), "rate labels");
        assert!(svg.contains("ebpf") && svg.contains("poll-10s"), "legend");
        assert_eq!(svg.matches('×').count(), 2, "a cross for each cell without a detection");
        assert!(svg.matches("<rect").count() >= 2, "bars");
    }
}
