//! The probes' `--plot`: throughput per case as an SVG, ours beside the cost model's, the
//! field's and the rated figure.

use super::report::Measured;

/// Draws TOPS per point: ours, the model's, the field's and the rated, on a log scale.
pub fn draw(
    path: &std::path::Path,
    title: &str,
    labels: &[String],
    rows: &[&Measured],
    ours_label: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let n = rows.len().max(1);
    let values = rows.iter().flat_map(|r| {
        [Some(r.tops), r.modelled_tops(), r.field, r.rated]
            .into_iter()
            .flatten()
    });
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if lo > hi {
        (1e-3, 1.0)
    } else {
        (lo / 2.0, hi * 8.0)
    };
    let width = (150 + 140 * n).max(960) as u32;
    let root = SVGBackend::new(path, (width, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), (lo..hi).log_scale())?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_label_style(("sans-serif", 13))
        .disable_x_mesh()
        .y_desc("TOPS (log scale)")
        .draw()?;
    let series = |f: &dyn Fn(&Measured) -> Option<f64>| -> Vec<(f64, f64)> {
        rows.iter()
            .enumerate()
            .filter_map(|(i, r)| f(r).map(|v| (i as f64, v)))
            .collect()
    };
    let ours = series(&|r| Some(r.tops));
    let modelled = series(&|r| r.modelled_tops());
    let field = series(&|r| r.field);
    let rated = series(&|r| r.rated);
    // Field figures are hollow rings drawn around the points (the model matches them where it
    // was calibrated); lines only guide the eye between the cases.
    let styles = [
        (ours, BLUE, ours_label.to_string(), false),
        (modelled, RED, "RK3588 cost model".to_string(), false),
        (field, GREEN, "field (librknnrt 2.3.2)".to_string(), true),
        (
            rated,
            BLACK,
            "rated (2 TOPS per core, i8)".to_string(),
            false,
        ),
    ];
    for (points, color, name, ring) in styles {
        if points.is_empty() {
            continue;
        }
        if ring {
            chart
                .draw_series(
                    points
                        .into_iter()
                        .map(move |p| Circle::new(p, 9, color.stroke_width(3))),
                )?
                .label(name)
                .legend(move |(x, y)| Circle::new((x + 10, y), 6, color.stroke_width(2)));
        } else {
            chart
                .draw_series(LineSeries::new(points.clone(), color.mix(0.4)))?
                .label(name)
                .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
            chart.draw_series(
                points
                    .into_iter()
                    .map(move |p| Circle::new(p, 5, color.filled())),
            )?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}
