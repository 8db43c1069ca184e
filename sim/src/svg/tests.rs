use super::*;
use proptest::prelude::*;

/// A minimal XML well-formedness check: optional `<?xml …?>` prolog, one root element, balanced
/// and properly nested tags, quoted attributes without `<`, unique attribute names per tag, and
/// `&` only in the five predefined entities or numeric references. Returns the root's name.
fn check_xml(doc: &str) -> Result<String, String> {
    fn check_entities(text: &str, at: usize) -> Result<(), String> {
        let mut rest = text;
        while let Some(i) = rest.find('&') {
            let after = &rest[i + 1..];
            let end = after
                .find(';')
                .ok_or(format!("unterminated entity near byte {at}"))?;
            let name = &after[..end];
            let numeric = name.strip_prefix("#x").map_or_else(
                || {
                    name.strip_prefix('#')
                        .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
                },
                |h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()),
            );
            if !numeric && !["amp", "lt", "gt", "quot", "apos"].contains(&name) {
                return Err(format!("unknown entity &{name}; near byte {at}"));
            }
            rest = &after[end + 1..];
        }
        Ok(())
    }
    fn is_name(s: &str) -> bool {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_:.".contains(c))
            && !s.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '.')
    }

    let mut rest = doc;
    if let Some(after) = rest.strip_prefix("<?xml") {
        let end = after.find("?>").ok_or("unterminated prolog")?;
        rest = &after[end + 2..];
    }
    let mut stack: Vec<String> = Vec::new();
    let mut root: Option<String> = None;
    let mut pos = doc.len() - rest.len();
    while !rest.is_empty() {
        let lt = rest.find('<').unwrap_or(rest.len());
        let text = &rest[..lt];
        if stack.is_empty() && !text.trim().is_empty() {
            return Err(format!("text outside the root element at byte {pos}"));
        }
        check_entities(text, pos)?;
        rest = &rest[lt..];
        pos += lt;
        if rest.is_empty() {
            break;
        }
        let gt = rest
            .find('>')
            .ok_or(format!("unterminated tag at byte {pos}"))?;
        let tag = &rest[1..gt];
        if tag.contains('<') {
            return Err(format!("'<' inside a tag at byte {pos}"));
        }
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack.pop().ok_or(format!(
                "close tag </{name}> without open tag at byte {pos}"
            ))?;
            if open != name.trim() {
                return Err(format!("</{name}> closes <{open}> at byte {pos}"));
            }
        } else {
            let self_closing = tag.ends_with('/');
            let body = tag.trim_end_matches('/');
            let name_end = body.find(char::is_whitespace).unwrap_or(body.len());
            let name = &body[..name_end];
            if !is_name(name) {
                return Err(format!("bad element name {name:?} at byte {pos}"));
            }
            // Attributes: name="value" pairs.
            let mut attrs = body[name_end..].trim_start();
            let mut seen = Vec::new();
            while !attrs.is_empty() {
                let eq = attrs
                    .find('=')
                    .ok_or(format!("attribute without value in <{name}> at byte {pos}"))?;
                let attr = attrs[..eq].trim();
                if !is_name(attr) || seen.contains(&attr) {
                    return Err(format!(
                        "bad or repeated attribute {attr:?} in <{name}> at byte {pos}"
                    ));
                }
                seen.push(attr);
                let value = attrs[eq + 1..].trim_start();
                let quote = value.chars().next().filter(|&c| c == '"' || c == '\'');
                let quote = quote.ok_or(format!(
                    "unquoted attribute {attr} in <{name}> at byte {pos}"
                ))?;
                let close = value[1..]
                    .find(quote)
                    .ok_or(format!("unterminated attribute {attr} at byte {pos}"))?;
                check_entities(&value[1..1 + close], pos)?;
                attrs = value[close + 2..].trim_start();
            }
            if stack.is_empty() {
                if root.is_some() {
                    return Err(format!("second root element <{name}> at byte {pos}"));
                }
                root = Some(name.to_owned());
            }
            if !self_closing {
                stack.push(name.to_owned());
            }
        }
        rest = &rest[gt + 1..];
        pos += gt + 1;
    }
    if let Some(open) = stack.pop() {
        return Err(format!("<{open}> is never closed"));
    }
    root.ok_or_else(|| "no root element".to_owned())
}

fn assert_svg(doc: &str) {
    match check_xml(doc) {
        Ok(root) => assert_eq!(root, "svg"),
        Err(e) => panic!("not well-formed: {e}\n{doc}"),
    }
    for bad in ["NaN", "inf"] {
        assert!(!doc.contains(bad), "output contains {bad}:\n{doc}");
    }
}

#[test]
fn checker_rejects_malformed_documents() {
    assert!(check_xml("<svg><g></svg>").is_err());
    assert!(check_xml("<svg></g></svg>").is_err());
    assert!(check_xml("<svg><text>a < b</text></svg>").is_err());
    assert!(check_xml("<svg><text>a & b</text></svg>").is_err());
    assert!(check_xml("<svg a=\"1\" a=\"2\"/>").is_err());
    assert!(check_xml("<svg a=1/>").is_err());
    assert!(check_xml("<svg/><svg/>").is_err());
    assert!(check_xml("<svg>").is_err());
    assert_eq!(
        check_xml("<?xml version=\"1.0\"?>\n<svg a=\"&amp;&#38;\"><g/>x &lt; y</svg>\n"),
        Ok("svg".into())
    );
}

fn series(label: &str, points: &[(f64, f64)]) -> Series {
    Series {
        label: label.to_owned(),
        points: points.to_vec(),
    }
}

#[test]
fn escape_handles_markup_characters() {
    assert_eq!(
        escape("a<b & \"c\" 'd' >"),
        "a&lt;b &amp; &quot;c&quot; &apos;d&apos; &gt;"
    );
    assert_eq!(escape("bell\u{7}"), "bell\u{FFFD}");
}

#[test]
fn line_plot_escapes_all_labels() {
    let doc = line_plot(
        "T<itle> & \"x\"",
        "x <axis>",
        "y & axis",
        &[series("DHHT <R/R> & \"co\"", &[(0.0, 1.0), (1.0, 2.0)])],
    );
    assert_svg(&doc);
    assert!(doc.contains("T&lt;itle&gt; &amp; &quot;x&quot;"));
    assert!(doc.contains("x &lt;axis&gt;"));
    assert!(doc.contains("y &amp; axis"));
    assert!(doc.contains("DHHT &lt;R/R&gt; &amp; &quot;co&quot;"));
    assert!(!doc.contains("<itle>") && !doc.contains("<R/R>"));
}

#[test]
fn bar_chart_escapes_all_labels() {
    let doc = bar_chart(
        "Stretch <factor> & \"jobs\"",
        "y <",
        &["HPC2N & <co>".to_owned()],
        &[("WS \"Head\"".to_owned(), vec![1.5])],
    );
    assert_svg(&doc);
    assert!(doc.contains("Stretch &lt;factor&gt; &amp; &quot;jobs&quot;"));
    assert!(doc.contains("HPC2N &amp; &lt;co&gt;"));
    assert!(doc.contains("WS &quot;Head&quot;"));
}

#[test]
fn empty_inputs_give_an_empty_frame() {
    for doc in [
        line_plot("t", "x", "y", &[]),
        line_plot("t", "x", "y", &[series("a", &[])]),
        step_plot("t", "x", "y", &[series("a", &[(f64::NAN, 1.0)])]),
        bar_chart("t", "y", &[], &[]),
        bar_chart("t", "y", &["g".to_owned()], &[("s".to_owned(), vec![])]),
    ] {
        assert_svg(&doc);
        assert!(doc.contains("no data"), "{doc}");
    }
}

#[test]
fn non_finite_points_break_the_line() {
    let doc = line_plot(
        "t",
        "x",
        "y",
        &[series(
            "a",
            &[
                (0.0, 1.0),
                (1.0, f64::NAN),
                (2.0, 3.0),
                (f64::INFINITY, 1.0),
                (3.0, 2.0),
                (4.0, f64::NEG_INFINITY),
            ],
        )],
    );
    assert_svg(&doc);
    let path = doc
        .lines()
        .find(|l| l.starts_with("<path d=\"M") && l.contains("clip-path"))
        .unwrap();
    assert_eq!(
        path.matches('M').count(),
        3,
        "three separate pieces: {path}"
    );
    assert!(!doc.contains("no data"));
}

#[test]
fn bar_chart_skips_missing_and_non_finite_values() {
    let groups: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    let doc = bar_chart(
        "t",
        "y",
        &groups,
        &[
            ("s1".to_owned(), vec![1.0, f64::NAN, -2.0]),
            ("s2".to_owned(), vec![f64::INFINITY, 3.0]),
        ],
    );
    assert_svg(&doc);
    // 3 finite values → 3 bars (each carries a <title>), plus 2 legend swatches.
    assert_eq!(doc.matches("</title></rect>").count(), 3);
    assert_eq!(doc.matches("fill=\"url(#bar").count(), 5);
    // Negative values extend the axis below zero.
    assert!(doc.contains(">-2<") || doc.contains(">-2.0<"), "{doc}");
}

#[test]
fn series_differ_in_colour_and_dash_for_grayscale() {
    let many: Vec<Series> = (0..6)
        .map(|i| series(&format!("s{i}"), &[(0.0, i as f64), (1.0, 1.0)]))
        .collect();
    let doc = line_plot("t", "x", "y", &many);
    assert_svg(&doc);
    let styles: Vec<String> = (0..6).map(line_style).collect();
    for (i, a) in styles.iter().enumerate() {
        for b in &styles[i + 1..] {
            assert_ne!(a, b);
        }
        // Each style appears for the line and for its legend entry.
        assert_eq!(doc.matches(a.as_str()).count(), 2, "{a}");
    }
    let dashes: std::collections::HashSet<_> = (0..6).map(|i| DASHES[i]).collect();
    assert_eq!(dashes.len(), 6, "six distinct dash patterns");
    // Few points: markers of different shapes are drawn.
    assert!(doc.contains("<circle") && doc.contains("<rect x=") && doc.contains("Z\" fill="));
    let bars = bar_chart(
        "t",
        "y",
        &["g".to_owned()],
        &(0..6)
            .map(|i| (format!("s{i}"), vec![1.0]))
            .collect::<Vec<_>>(),
    );
    assert_svg(&bars);
    assert_eq!(bars.matches("<pattern id=").count(), 6);
}

#[test]
fn step_plot_draws_horizontal_then_vertical() {
    let doc = step_plot(
        "Availability",
        "day",
        "available",
        &[series("office", &[(0.0, 0.0), (1.0, 0.9), (2.0, 0.5)])],
    );
    assert_svg(&doc);
    let path = doc
        .lines()
        .find(|l| l.starts_with("<path d=\"M") && l.contains("clip-path"))
        .unwrap();
    assert_eq!(path.matches('H').count(), 2);
    assert_eq!(path.matches('V').count(), 2);
}

#[test]
fn axis_ticks_are_nice_and_cover_the_data() {
    let a = Axis::new([0.0, 0.93].into_iter(), false);
    assert_eq!((a.lo, a.hi), (0.0, 1.0));
    assert_eq!(a.ticks.len(), 6);
    assert_eq!(a.label(0.4), "0.4");
    let a = Axis::new([3.0, 3.0].into_iter(), false);
    assert!(a.lo < 3.0 && a.hi > 3.0);
    let a = Axis::new([5.0, 60.0].into_iter(), true);
    assert_eq!((a.lo, a.hi), (0.0, 60.0));
    assert_eq!(a.label(20.0), "20");
    let a = Axis::new([0.0, 6_740_009.0].into_iter(), true);
    assert!(a.hi >= 6_740_009.0 && a.ticks.len() <= 11);
    assert_eq!(format_number(2.5e7, 5e6), "2.5e7");
}

proptest! {
    #[test]
    fn any_input_gives_well_formed_svg(
        // No 'i' or 'N', so the labels cannot spell "inf" or "NaN" themselves.
        labels in prop::collection::vec("[a-hj-zA-M0-9<>&\"' ,;/]{0,12}", 0..5),
        raw in prop::collection::vec(prop::collection::vec((any::<f64>(), any::<f64>()), 0..12), 0..5),
        special in prop::collection::vec(prop::sample::select(vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, f64::MAX, f64::MIN, 0.0, -0.0, 5e-324, 1e-300]), 0..4),
    ) {
        let mut series: Vec<Series> = labels
            .iter()
            .zip(raw.iter())
            .map(|(l, p)| Series { label: l.clone(), points: p.clone() })
            .collect();
        if let Some(s) = series.first_mut() {
            s.points.extend(special.iter().map(|&v| (v, v)));
        }
        assert_svg(&line_plot("t", "x", "y", &series));
        assert_svg(&step_plot("t", "x", "y", &series));
        let groups: Vec<String> = labels.clone();
        let bars: Vec<(String, Vec<f64>)> = series.iter().map(|s| (s.label.clone(), s.points.iter().map(|p| p.1).collect())).collect();
        assert_svg(&bar_chart("t", "y", &groups, &bars));
    }
}
