//! The reaction benchmark's plot: p50 detection latency per rate and mode as bars on a log
//! scale, p99 as a tick, a cross where the kernel OOM killer always came first.

use std::path::Path;

use plotters::prelude::*;

use crate::reaction::{Mode, Percentiles, Row};

/// Bars of p50 detection latency (log scale) per rate and mode, with a tick at p99; cells
/// where the kernel OOM killer always came first are marked with a cross.
pub(crate) fn plot(rows: &[Row], rates: &[u64], modes: &[Mode], path: &Path) -> anyhow::Result<()> {
    let colors = [
        RGBColor(0x1b, 0x9e, 0x77),
        RGBColor(0xd9, 0x5f, 0x02),
        RGBColor(0x75, 0x70, 0xb3),
        RGBColor(0xe7, 0x29, 0x8a),
        RGBColor(0x66, 0xa6, 0x1e),
    ];
    let root = SVGBackend::new(path, (960, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let groups = rates.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption("evictd detection latency: p50 bar, p99 tick (ms, log scale)", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..groups - 0.5, (0.01f64..100_000f64).log_scale())
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
                p.map(|p| Rectangle::new([(x0(*g), 0.01), (x0(*g) + slot * 0.9, p.p50)], color.filled()))
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
                Text::new("×", (x0(*g) + slot * 0.3, 0.02), ("sans-serif", 14).into_font().color(&color))
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
