//! Bucketing of key fields, declared per namespace: nearby problem sizes share one tuning
//! result (e.g. sizes rounded up to powers of two), so a workload with many distinct shapes
//! tunes a few buckets instead of every shape.

use cache_core::cache_format::{Fields, Value};

/// How one integer key field is bucketed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Round up to the next power of two (values ≤ 1 stay).
    PowerOfTwo,
    /// Round up to a multiple of this.
    Multiple(i64),
    /// The number of decimal digits (`ceil(log10(v + 1))`), at least this floor: WarpConvNet's
    /// coordinate-count bins.
    Log10 {
        /// The smallest bin.
        floor: i64,
    },
}

impl Rule {
    fn apply(self, v: i64) -> i64 {
        match self {
            Rule::PowerOfTwo => {
                if v <= 1 {
                    v
                } else {
                    // Past 2^62 the next power of two does not fit in i64: keep the value.
                    (v as u64)
                        .checked_next_power_of_two()
                        .and_then(|p| i64::try_from(p).ok())
                        .unwrap_or(v)
                }
            }
            Rule::Multiple(m) if m > 0 => match v.rem_euclid(m) {
                0 => v,
                // Rounding up past i64::MAX keeps the value rather than overflowing.
                r => v.checked_add(m - r).unwrap_or(v),
            },
            Rule::Multiple(_) => v,
            Rule::Log10 { floor } => {
                let mut digits = 0;
                let mut x = v.max(0);
                while x > 0 {
                    digits += 1;
                    x /= 10;
                }
                digits.max(floor)
            }
        }
    }
}

/// The bucketing of a namespace: rules by field name. Integer fields (and lists of integers)
/// named here are bucketed; everything else is kept as is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bucketing {
    rules: Vec<(String, Rule)>,
}

impl Bucketing {
    /// No bucketing: every distinct key is tuned.
    pub fn none() -> Self {
        Bucketing::default()
    }

    /// Adds a rule for `field`.
    pub fn field(mut self, field: impl Into<String>, rule: Rule) -> Self {
        self.rules.push((field.into(), rule));
        self
    }

    /// Whether there are no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The bucketed fields of a key.
    pub fn apply(&self, mut fields: Fields) -> Fields {
        for (name, rule) in &self.rules {
            if let Some(v) = fields.get_mut(name) {
                bucket_value(v, *rule);
            }
        }
        fields
    }
}

fn bucket_value(v: &mut Value, rule: Rule) {
    match v {
        Value::Int(i) => *i = rule.apply(*i),
        Value::List(items) => items.iter_mut().for_each(|x| bucket_value(x, rule)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_round_as_documented() {
        assert_eq!(Rule::PowerOfTwo.apply(100), 128);
        assert_eq!(Rule::PowerOfTwo.apply(128), 128);
        assert_eq!(Rule::PowerOfTwo.apply(1), 1);
        assert_eq!(Rule::Multiple(64).apply(65), 128);
        assert_eq!(Rule::Log10 { floor: 4 }.apply(500), 4);
        assert_eq!(Rule::Log10 { floor: 4 }.apply(500_000), 6);
    }

    #[test]
    fn extreme_values_neither_panic_nor_wrap() {
        assert_eq!(Rule::PowerOfTwo.apply(i64::MAX), i64::MAX);
        assert_eq!(Rule::PowerOfTwo.apply((1 << 62) + 1), (1 << 62) + 1);
        assert_eq!(Rule::PowerOfTwo.apply(-7), -7);
        assert_eq!(Rule::Multiple(64).apply(i64::MAX), i64::MAX);
        assert_eq!(Rule::Multiple(64).apply(i64::MIN), i64::MIN);
        assert_eq!(Rule::Multiple(64).apply(-65), -64);
        assert_eq!(Rule::Log10 { floor: 1 }.apply(i64::MIN), 1);
    }

    #[test]
    fn only_named_integer_fields_change() {
        let b = Bucketing::none()
            .field("m", Rule::PowerOfTwo)
            .field("shape", Rule::Multiple(8));
        let f = Fields::from([
            ("m".to_owned(), Value::Int(100)),
            ("n".to_owned(), Value::Int(100)),
            ("shape".to_owned(), Value::from(vec![3i64, 9])),
            ("dtype".to_owned(), Value::from("f32")),
        ]);
        let out = b.apply(f);
        assert_eq!(out.get("m"), Some(&Value::Int(128)));
        assert_eq!(out.get("n"), Some(&Value::Int(100)));
        assert_eq!(out.get("shape"), Some(&Value::from(vec![8i64, 16])));
    }
}
