//! Java's text forms of numbers, as Debezium's JSON formatter and Kafka Connect's JsonConverter
//! (Jackson) print them: `Double.toString` (Java SE 19+ `Double.toString(double)`: the
//! shortest decimal that reads back as the value, plain between 10^-3 and 10^7, else
//! "computerized scientific notation" `d.dddE±n`) and `new BigDecimal(double).toPlainString()`
//! (the exact binary value in decimal, no exponent).

/// `Double.toString(x)` for a finite `x`: `1.0`, `0.1`, `-0.0`, `1.0E21`, `1.0E-7`,
/// `1.2345678E7`. Non-finite values (which JSON cannot hold) print as Java does: `NaN`,
/// `Infinity`, `-Infinity`.
pub fn double_to_string(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` gives the shortest digits that read back as x, the nearest of them when
    // two qualify: the digits Java SE 19+ chooses (JDK-4511638).
    let mut sci = format!("{:e}", x.abs());
    if !sci.contains('.') {
        // One digit reads back as x: Java then takes the nearest decimal of one or two digits
        // (`Double.toString`: "when m = 1, … T … with length 1 or 2"), 4.9E-324 not 5.0E-324.
        sci = format!("{:.1e}", x.abs());
    }
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let mut digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    while digits.len() > 1 && digits.ends_with('0') {
        digits.pop();
    }
    let mut out = String::with_capacity(digits.len() + 8);
    if x < 0.0 {
        out.push('-');
    }
    if (-3..7).contains(&exp) {
        // Plain: at least one digit on each side of the point.
        if exp < 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            out.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        out.push('.');
        out.push_str(if digits.len() > 1 { &digits[1..] } else { "0" });
        out.push('E');
        out.push_str(&exp.to_string());
    }
    out
}

/// `new BigDecimal(x).toPlainString()` for a finite `x`: every digit of the binary value,
/// without exponent and without trailing fraction zeros (`1000000000000000000000`,
/// `0.1000000000000000055511151231257827021181583404541015625`, `0` for ±0.0).
pub fn double_exact_plain(x: f64) -> String {
    if !x.is_finite() {
        return double_to_string(x);
    }
    if x == 0.0 {
        return "0".into();
    }
    // Rust prints the exact binary value when asked for enough digits: a double has at most
    // 1074 fraction digits (the smallest subnormal, 2^-1074).
    let mut s = if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1074}")
    };
    if s.contains('.') {
        let trimmed = s.trim_end_matches('0').trim_end_matches('.').len();
        s.truncate(trimmed);
    }
    s
}

/// A double as Debezium's binlog JSON formatter prints it (`JsonStringFormatter.value(double)`
/// of mysql-binlog-connector-java): `Double.toString`, unless that has an exponent, then the
/// exact value in plain decimal.
pub fn debezium_json_double(x: f64) -> String {
    let s = double_to_string(x);
    if s.contains('E') {
        double_exact_plain(x)
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn double_to_string_follows_java() {
        // Values and texts from the Java SE 21 `Double.toString` documentation and jshell.
        for (x, java) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (100.0, "100.0"),
            (1.5, "1.5"),
            (0.001, "0.001"),
            (0.0001, "1.0E-4"),
            (1e-7, "1.0E-7"),
            (1234567.0, "1234567.0"),
            (1e7, "1.0E7"),
            (12345678.5, "1.23456785E7"),
            (1e21, "1.0E21"),
            (-2.5e-5, "-2.5E-5"),
            (f64::MAX, "1.7976931348623157E308"),
            (f64::MIN_POSITIVE, "2.2250738585072014E-308"),
            (4.9e-324, "4.9E-324"),
            (2e23, "2.0E23"),
            (123.456, "123.456"),
            (9007199254740993.0, "9.007199254740992E15"),
        ] {
            assert_eq!(double_to_string(x), java, "{x:e}");
        }
    }

    #[test]
    fn exact_plain_is_the_binary_value() {
        assert_eq!(double_exact_plain(1e21), "1000000000000000000000");
        assert_eq!(
            double_exact_plain(0.1),
            "0.1000000000000000055511151231257827021181583404541015625"
        );
        assert_eq!(double_exact_plain(12345678.5), "12345678.5");
        assert_eq!(double_exact_plain(-2.0), "-2");
        assert_eq!(double_exact_plain(0.5), "0.5");
        assert_eq!(
            double_exact_plain(1e-7),
            "0.0000000999999999999999954748111825886258685613938723690807819366455078125"
        );
        let tiny = double_exact_plain(4.9e-324);
        assert!(tiny.starts_with("0.000") && tiny.ends_with("5"), "{tiny}");
        assert_eq!(tiny.len(), "0.".len() + 1074);
    }

    #[test]
    fn debezium_json_double_uses_the_plain_form_only_without_exponent() {
        assert_eq!(debezium_json_double(1.5), "1.5");
        assert_eq!(debezium_json_double(0.1), "0.1");
        assert_eq!(debezium_json_double(1e21), "1000000000000000000000");
        assert_eq!(debezium_json_double(12345678.5), "12345678.5");
        assert_eq!(debezium_json_double(-0.0), "-0.0");
    }
}
