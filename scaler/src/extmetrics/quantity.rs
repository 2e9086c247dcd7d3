//! Kubernetes quantity strings for metric values. The HPA reads only
//! `MilliValue()` = ceil(q·1000), so values are emitted in milli-units, rounded up, in
//! canonical form (`"1500m"`, `"3"`, `"0"`).

/// Canonical quantity of `v` with milli precision (rounded up, as Kubernetes does for
/// values finer than the scale). NaN, ±Inf and negatives are `"0"` (KEDA does the same).
pub fn quantity(v: f64) -> String {
    if !v.is_finite() || v <= 0.0 {
        return "0".into();
    }
    let milli = (v * 1000.0 - 1e-9).ceil();
    if milli >= 9.2e18 {
        return format!("{}", i64::MAX / 1000);
    }
    let m = milli as i64;
    if m % 1000 == 0 {
        let units = m / 1000;
        // Largest decimal suffix without losing precision.
        for (div, suffix) in [
            (1_000_000_000_000_000i64, "E"),
            (1_000_000_000_000, "P"),
            (1_000_000_000, "G"),
            (1_000_000, "M"),
            (1000, "k"),
        ] {
            if units % div == 0 && units >= div {
                return format!("{}{suffix}", units / div);
            }
        }
        units.to_string()
    } else {
        format!("{m}m")
    }
}

#[cfg(test)]
mod tests {
    use super::quantity;

    #[test]
    fn canonical_forms() {
        assert_eq!(quantity(1.5), "1500m");
        assert_eq!(quantity(3.0), "3");
        assert_eq!(quantity(2000.0), "2k");
        assert_eq!(quantity(1500.0), "1500");
        assert_eq!(quantity(0.0005), "1m"); // rounded up to milli
        assert_eq!(quantity(0.0), "0");
        assert_eq!(quantity(-2.0), "0");
        assert_eq!(quantity(f64::NAN), "0");
        assert_eq!(quantity(0.1 + 0.2), "300m");
    }
}
