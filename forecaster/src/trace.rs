//! The two trace formats of REPLAY.md ("Inputs"), turned into per-second arrivals `a(s)`.
//!
//! - **Request log**, header `TIMESTAMP,ContextTokens,GeneratedTokens` (the Azure LLM inference
//!   format): one request per row, `TIMESTAMP` = `YYYY-MM-DD HH:MM:SS` with an optional fraction
//!   of any number of digits, no zone (also read: a `T` for the space and a zone, `Z`,
//!   `±HH:MM`, `±HHMM` or `±HH`, which puts the row in UTC). t0 = the earliest timestamp with
//!   its fraction dropped; a request arrives in second `s = floor(ts − t0)`, which is exactly
//!   "whole seconds of `ts` minus whole seconds of t0" (the fraction of `ts` is in `[0, 1)`),
//!   so no floating point is involved. Rows may be in any order. `T = last s + 1`.
//! - **Rate series**, header `window_start_s,rate_rps`: a piecewise-constant rate. Window `i`
//!   covers `[start_i, start_{i+1})`; the last window has the width of the first one
//!   (`start_1 − start_0`). `a(s)` = the rate of the window holding `s`, with `s` counted from the
//!   first start. `T = last start + width − first start`.
//!
//! Parsing rules beyond the contract (all checked, never a panic):
//! - A UTF-8 byte-order mark before the header is ignored; blank lines are skipped everywhere;
//!   `\r\n` line ends are accepted; each field is trimmed and one pair of surrounding double
//!   quotes is removed.
//! - The header's first fields must be exactly the format's column names; extra columns after
//!   them are allowed (and ignored) in the header and in the rows.
//! - Request log: the token columns must be non-negative integers (they are checked, then
//!   dropped: unused in v1). Fractions need at least one digit after the dot.
//! - Rate series: starts are integers (an integral float such as `600.0` is accepted), strictly
//!   increasing; rates are finite and `≥ 0` (`NaN`/`inf` are rejected as bad numbers). A file with
//!   a single window is an error ([`TraceError::SingleWindow`]): its width is undefined, and
//!   an outside scorer could not reproduce any width we picked.
//! - A trace longer than [`MAX_TRACE_SECONDS`] is rejected ([`TraceError::TooLong`]) instead of
//!   allocating an unbounded per-second vector.
//!
//! Every error names the 1-based physical line (the header is line 1 unless blank lines precede
//! it) and, for a bad field, the 1-based column and its name.

use std::io::BufRead;

/// The longest trace accepted, in seconds (366 days). The replay keeps a few `f64` per second.
pub const MAX_TRACE_SECONDS: u64 = 366 * 86_400;

const REQUEST_LOG_COLUMNS: [&str; 3] = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"];
const RATE_SERIES_COLUMNS: [&str; 2] = ["window_start_s", "rate_rps"];

/// Which of the two formats a trace came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceKind {
    /// A request log; `requests` = number of rows (= total arrival mass).
    RequestLog { requests: u64 },
    /// A rate series; `window_s` = width of the first window (the last window's width too).
    RateSeries { window_s: u64 },
}

/// Per-second arrivals of one trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// `arrivals[s]` = `a(s)`, arrival mass in second `s`, for `s` in `0..T`. Finite, `≥ 0`.
    pub arrivals: Vec<f64>,
    pub kind: TraceKind,
    /// What second 0 is: the earliest timestamp without its fraction (request log, e.g.
    /// `2023-11-16 18:17:03`) or the first window start (rate series, e.g. `0`).
    pub t0_label: String,
}

impl Trace {
    /// `T`, the trace length in seconds.
    pub fn len(&self) -> usize {
        self.arrivals.len()
    }

    pub fn is_empty(&self) -> bool {
        self.arrivals.is_empty()
    }

    /// The first `t` seconds of this trace (all of it when `t ≥ T`); kind and label are kept.
    pub fn truncated(&self, t: usize) -> Trace {
        Trace {
            arrivals: self.arrivals[..t.min(self.arrivals.len())].to_vec(),
            kind: self.kind,
            t0_label: self.t0_label.clone(),
        }
    }

    /// Total arrival mass `Σ a(s)`.
    pub fn total_arrivals(&self) -> f64 {
        self.arrivals.iter().sum()
    }
}

/// Why a trace could not be read. Line and column numbers are 1-based.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TraceError {
    #[error("trace is empty: no header line")]
    Empty,
    #[error(
        "line {line}: unknown trace header {found:?}; expected `TIMESTAMP,ContextTokens,GeneratedTokens` \
         (request log) or `window_start_s,rate_rps` (rate series)"
    )]
    UnknownHeader { line: usize, found: String },
    #[error("line {line}: the header is not followed by any data row")]
    NoRows { line: usize },
    #[error("line {line}: column {column} `{name}` is missing (the row has {got} fields)")]
    MissingField { line: usize, column: usize, name: &'static str, got: usize },
    #[error("line {line}, column {column} `{name}`: bad timestamp {value:?} ({reason}); expected `YYYY-MM-DD HH:MM:SS[.fraction]`")]
    BadTimestamp { line: usize, column: usize, name: &'static str, value: String, reason: &'static str },
    #[error("line {line}, column {column} `{name}`: bad number {value:?}; expected {expected}")]
    BadNumber { line: usize, column: usize, name: &'static str, value: String, expected: &'static str },
    #[error("line {line}, column 1 `window_start_s`: window start {start} is not after the previous start {previous}")]
    NonIncreasingStart { line: usize, start: i64, previous: i64 },
    #[error("line {line}, column 2 `rate_rps`: negative rate {value}")]
    NegativeRate { line: usize, value: f64 },
    #[error("line {line}: a rate series needs at least two windows (the window width is the difference of the first two starts)")]
    SingleWindow { line: usize },
    #[error("trace spans {seconds} s, more than the limit of {limit} s")]
    TooLong { seconds: u64, limit: u64 },
    #[error("line {line}: read error: {message}")]
    Io { line: usize, message: String },
}

/// Parses a whole trace file held in memory. The format is chosen by the header.
pub fn parse_trace(text: &str) -> Result<Trace, TraceError> {
    let mut parser = Parser::default();
    for (i, line) in text.lines().enumerate() {
        parser.line(i + 1, line)?;
    }
    parser.finish()
}

/// Parses a trace from a reader, line by line (the caller opens the file; this crate does no I/O
/// of its own). Read errors become [`TraceError::Io`]; invalid UTF-8 is a read error.
pub fn read_trace<R: BufRead>(mut reader: R) -> Result<Trace, TraceError> {
    let mut parser = Parser::default();
    let mut buf = String::new();
    let mut line_no = 0usize;
    loop {
        buf.clear();
        line_no += 1;
        match reader.read_line(&mut buf) {
            Ok(0) => break,
            Ok(_) => {
                let line = buf.strip_suffix('\n').unwrap_or(&buf);
                let line = line.strip_suffix('\r').unwrap_or(line);
                parser.line(line_no, line)?;
            }
            Err(e) => return Err(TraceError::Io { line: line_no, message: e.to_string() }),
        }
    }
    parser.finish()
}

/// A trace from a regular rate series (e.g. a Prometheus range query with step `window_s`):
/// `a(s) = rates[s / window_s]`, `T = window_s · rates.len()`, label `"0"`.
///
/// Lenient by design: a rate that is `NaN`, infinite or negative becomes `0`, a `window_s` of 0
/// gives an empty trace, and the trace is cut at [`MAX_TRACE_SECONDS`]. Use
/// [`try_trace_from_rates`] to reject such input instead.
pub fn trace_from_rates(window_s: u64, rates: &[f64]) -> Trace {
    let clean: Vec<f64> = rates.iter().map(|&r| if r.is_finite() && r > 0.0 { r } else { 0.0 }).collect();
    let max_windows = MAX_TRACE_SECONDS.checked_div(window_s).unwrap_or(0);
    let keep = clean.len().min(usize::try_from(max_windows).unwrap_or(usize::MAX));
    build_regular(window_s, &clean[..keep])
}

/// Like [`trace_from_rates`], but a non-finite or negative rate, a zero window or a trace longer
/// than [`MAX_TRACE_SECONDS`] is an error. `line` in the error is the 1-based index of the rate.
pub fn try_trace_from_rates(window_s: u64, rates: &[f64]) -> Result<Trace, TraceError> {
    for (i, &r) in rates.iter().enumerate() {
        if !r.is_finite() {
            return Err(TraceError::BadNumber {
                line: i + 1,
                column: 2,
                name: "rate_rps",
                value: r.to_string(),
                expected: "a finite rate",
            });
        }
        if r < 0.0 {
            return Err(TraceError::NegativeRate { line: i + 1, value: r });
        }
    }
    if window_s == 0 {
        return Err(TraceError::BadNumber {
            line: 0,
            column: 1,
            name: "window_start_s",
            value: "0".into(),
            expected: "a window width of at least 1 s",
        });
    }
    let seconds = window_s.saturating_mul(rates.len() as u64);
    if seconds > MAX_TRACE_SECONDS {
        return Err(TraceError::TooLong { seconds, limit: MAX_TRACE_SECONDS });
    }
    Ok(build_regular(window_s, rates))
}

fn build_regular(window_s: u64, rates: &[f64]) -> Trace {
    let w = usize::try_from(window_s).unwrap_or(0);
    let mut arrivals = Vec::with_capacity(w.saturating_mul(rates.len()));
    for &r in rates {
        // -0.0 → 0.0 so that every arrival compares and prints as a plain non-negative number.
        let r = if r == 0.0 { 0.0 } else { r };
        arrivals.extend(std::iter::repeat_n(r, w));
    }
    Trace { arrivals, kind: TraceKind::RateSeries { window_s }, t0_label: "0".into() }
}

#[derive(Default)]
enum State {
    #[default]
    Header,
    RequestLog {
        header_line: usize,
        /// Whole seconds since 0000-03-01 (proleptic Gregorian) of each request.
        seconds: Vec<i64>,
    },
    RateSeries {
        header_line: usize,
        /// (line, start, rate)
        windows: Vec<(usize, i64, f64)>,
    },
}

#[derive(Default)]
struct Parser {
    state: State,
}

impl Parser {
    fn line(&mut self, line_no: usize, raw: &str) -> Result<(), TraceError> {
        let raw = if line_no == 1 { raw.strip_prefix('\u{feff}').unwrap_or(raw) } else { raw };
        if raw.trim().is_empty() {
            return Ok(());
        }
        match &mut self.state {
            State::Header => {
                let fields: Vec<&str> = raw.split(',').map(clean_field).collect();
                if starts_with(&fields, &REQUEST_LOG_COLUMNS) {
                    self.state = State::RequestLog { header_line: line_no, seconds: Vec::new() };
                } else if starts_with(&fields, &RATE_SERIES_COLUMNS) {
                    self.state = State::RateSeries { header_line: line_no, windows: Vec::new() };
                } else {
                    let mut found: String = raw.trim().chars().take(120).collect();
                    if raw.trim().chars().count() > 120 {
                        found.push('…');
                    }
                    return Err(TraceError::UnknownHeader { line: line_no, found });
                }
            }
            State::RequestLog { seconds, .. } => {
                let fields = split_fields(raw, line_no, &REQUEST_LOG_COLUMNS)?;
                let ts = parse_timestamp(fields[0]).map_err(|reason| TraceError::BadTimestamp {
                    line: line_no,
                    column: 1,
                    name: REQUEST_LOG_COLUMNS[0],
                    value: fields[0].to_string(),
                    reason,
                })?;
                for (col, name) in REQUEST_LOG_COLUMNS.iter().enumerate().skip(1) {
                    if fields[col].parse::<u64>().is_err() {
                        return Err(TraceError::BadNumber {
                            line: line_no,
                            column: col + 1,
                            name,
                            value: fields[col].to_string(),
                            expected: "a non-negative integer token count",
                        });
                    }
                }
                seconds.push(ts);
            }
            State::RateSeries { windows, .. } => {
                let fields = split_fields(raw, line_no, &RATE_SERIES_COLUMNS)?;
                let start = parse_integer(fields[0]).ok_or_else(|| TraceError::BadNumber {
                    line: line_no,
                    column: 1,
                    name: RATE_SERIES_COLUMNS[0],
                    value: fields[0].to_string(),
                    expected: "an integer number of seconds",
                })?;
                let rate =
                    fields[1].parse::<f64>().ok().filter(|r| r.is_finite()).ok_or_else(|| TraceError::BadNumber {
                        line: line_no,
                        column: 2,
                        name: RATE_SERIES_COLUMNS[1],
                        value: fields[1].to_string(),
                        expected: "a finite number of requests per second",
                    })?;
                if rate < 0.0 {
                    return Err(TraceError::NegativeRate { line: line_no, value: rate });
                }
                if let Some(&(_, previous, _)) = windows.last() {
                    if start <= previous {
                        return Err(TraceError::NonIncreasingStart { line: line_no, start, previous });
                    }
                }
                let rate = if rate == 0.0 { 0.0 } else { rate };
                windows.push((line_no, start, rate));
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<Trace, TraceError> {
        match self.state {
            State::Header => Err(TraceError::Empty),
            State::RequestLog { header_line, seconds } => finish_request_log(header_line, seconds),
            State::RateSeries { header_line, windows } => finish_rate_series(header_line, windows),
        }
    }
}

fn finish_request_log(header_line: usize, seconds: Vec<i64>) -> Result<Trace, TraceError> {
    let (Some(&first), Some(&last)) = (seconds.iter().min(), seconds.iter().max()) else {
        return Err(TraceError::NoRows { line: header_line });
    };
    // Both are within years 0000..=9999, so the span fits easily in i64 and u64.
    let span = (last - first) as u64 + 1;
    if span > MAX_TRACE_SECONDS {
        return Err(TraceError::TooLong { seconds: span, limit: MAX_TRACE_SECONDS });
    }
    let mut arrivals = vec![0.0f64; span as usize];
    for &ts in &seconds {
        arrivals[(ts - first) as usize] += 1.0;
    }
    Ok(Trace {
        arrivals,
        kind: TraceKind::RequestLog { requests: seconds.len() as u64 },
        t0_label: format_timestamp(first),
    })
}

fn finish_rate_series(header_line: usize, windows: Vec<(usize, i64, f64)>) -> Result<Trace, TraceError> {
    let (first_line, first, _) = match windows.first() {
        Some(&w) => w,
        None => return Err(TraceError::NoRows { line: header_line }),
    };
    let Some(&(_, second, _)) = windows.get(1) else {
        return Err(TraceError::SingleWindow { line: first_line });
    };
    // Starts are strictly increasing, so every difference below is positive; i128 rules out
    // overflow for starts near the ends of the i64 range.
    let width = second as i128 - first as i128;
    let last = windows[windows.len() - 1].1;
    let total = last as i128 + width - first as i128;
    if total > MAX_TRACE_SECONDS as i128 {
        return Err(TraceError::TooLong {
            seconds: u64::try_from(total).unwrap_or(u64::MAX),
            limit: MAX_TRACE_SECONDS,
        });
    }
    let mut arrivals = Vec::with_capacity(total as usize);
    for (i, &(_, start, rate)) in windows.iter().enumerate() {
        let end = windows.get(i + 1).map_or(start as i128 + width, |w| w.1 as i128);
        arrivals.extend(std::iter::repeat_n(rate, (end - start as i128) as usize));
    }
    Ok(Trace { arrivals, kind: TraceKind::RateSeries { window_s: width as u64 }, t0_label: first.to_string() })
}

fn clean_field(f: &str) -> &str {
    let f = f.trim();
    f.strip_prefix('"').and_then(|g| g.strip_suffix('"')).map_or(f, str::trim)
}

fn starts_with(fields: &[&str], names: &[&str]) -> bool {
    fields.len() >= names.len() && fields.iter().zip(names).all(|(f, n)| f == n)
}

fn split_fields<'a>(raw: &'a str, line: usize, names: &[&'static str]) -> Result<Vec<&'a str>, TraceError> {
    let fields: Vec<&str> = raw.split(',').map(clean_field).collect();
    if fields.len() < names.len() {
        return Err(TraceError::MissingField {
            line,
            column: fields.len() + 1,
            name: names[fields.len()],
            got: fields.len(),
        });
    }
    Ok(fields)
}

/// An integer, or an integral float such as `600.0` (within ±2^53, where floats are exact).
fn parse_integer(s: &str) -> Option<i64> {
    if let Ok(v) = s.parse::<i64>() {
        return Some(v);
    }
    let v = s.parse::<f64>().ok()?;
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    (v.is_finite() && v.fract() == 0.0 && v.abs() <= EXACT).then_some(v as i64)
}

fn digits(s: &str) -> Option<i64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Splits an explicit zone off the end of a time of day: `Z`, `±HH:MM`, `±HHMM` or `±HH` (what
/// pandas, ISO 8601 and some exports of the Azure logs append). Returns the time without it and
/// the zone's offset from UTC in seconds (0 with no zone).
fn split_zone(time: &str) -> Result<(&str, i64), &'static str> {
    if let Some(t) = time.strip_suffix('Z').or_else(|| time.strip_suffix('z')) {
        return Ok((t, 0));
    }
    // A zone starts at the last sign after HH:MM:SS (a time of day has no sign of its own).
    let Some(at) = time.rfind(['+', '-']) else {
        return Ok((time, 0));
    };
    let (t, zone) = time.split_at(at);
    let sign = if zone.starts_with('-') { -1 } else { 1 };
    let z = &zone[1..];
    let (h, m) = match z.split_once(':') {
        Some((h, m)) => (h, m),
        // Only digits are split by position (a byte index inside a multi-byte character
        // would panic).
        None if z.len() == 4 && z.bytes().all(|b| b.is_ascii_digit()) => z.split_at(2),
        None if z.len() == 2 => (z, "00"),
        None => return Err("zone is not Z, ±HH:MM, ±HHMM or ±HH"),
    };
    match (h.len() == 2 && m.len() == 2, digits(h), digits(m)) {
        (true, Some(h), Some(m)) if h <= 23 && m <= 59 => Ok((t, sign * (h * 3600 + m * 60))),
        _ => Err("zone is not Z, ±HH:MM, ±HHMM or ±HH"),
    }
}

/// `YYYY-MM-DD HH:MM:SS[.f…]` → whole seconds since 0000-03-01 00:00:00 (fraction dropped).
/// Also read, beyond REPLAY.md's format, as other exports of the same logs write it: a `T`
/// between date and time, and an explicit zone (`Z`, `±HH:MM`, `±HHMM`, `±HH`), the time then
/// taken in UTC.
fn parse_timestamp(s: &str) -> Result<i64, &'static str> {
    let (date, time) = s.split_once([' ', 'T']).ok_or("no space or `T` between date and time")?;
    let (time, offset) = split_zone(time)?;
    let mut d = date.split('-');
    let (Some(y), Some(m), Some(dd), None) = (d.next(), d.next(), d.next(), d.next()) else {
        return Err("date is not YYYY-MM-DD");
    };
    if y.len() != 4 || m.len() != 2 || dd.len() != 2 {
        return Err("date is not YYYY-MM-DD");
    }
    let (year, month, day) = match (digits(y), digits(m), digits(dd)) {
        (Some(y), Some(m), Some(d)) => (y, m, d),
        _ => return Err("date is not YYYY-MM-DD"),
    };
    if !(1..=12).contains(&month) {
        return Err("month out of range");
    }
    if day < 1 || day > days_in_month(year, month) {
        return Err("day out of range");
    }
    let (hms, fraction) = match time.split_once('.') {
        Some((hms, f)) => (hms, Some(f)),
        None => (time, None),
    };
    if let Some(f) = fraction {
        if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
            return Err("fraction is not digits");
        }
    }
    let mut t = hms.split(':');
    let (Some(h), Some(mi), Some(se), None) = (t.next(), t.next(), t.next(), t.next()) else {
        return Err("time is not HH:MM:SS");
    };
    if h.len() != 2 || mi.len() != 2 || se.len() != 2 {
        return Err("time is not HH:MM:SS");
    }
    let (hour, minute, second) = match (digits(h), digits(mi), digits(se)) {
        (Some(h), Some(m), Some(s)) => (h, m, s),
        _ => return Err("time is not HH:MM:SS"),
    };
    if hour > 23 || minute > 59 || second > 59 {
        return Err("time of day out of range");
    }
    Ok(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 0000-03-01 of a proleptic-Gregorian date with `year ≥ 0` (years start in March so
/// that the leap day is the last day of the shifted year).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let (y, m) = if month <= 2 { (year - 1, month + 9) } else { (year, month - 3) };
    // y ≥ -1 here; shift by 400 years so the era arithmetic stays on non-negative numbers.
    let y = y + 400;
    let era = y / 400;
    let yoe = y % 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era - 1) * 146_097 + doe
}

fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 146_097; // undo the 400-year shift of `days_from_civil`
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + (era - 1) * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn format_timestamp(seconds: i64) -> String {
    let (days, rem) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// A rate series (`rates[s]`, piecewise constant over windows of `window` s) as the request
/// log of a service with that rate: rates × `k`, interpolated linearly between window
/// midpoints (a centred moving average one window wide; real traffic does not step at the
/// aggregation's window edges), and each second's count drawn from a Poisson law with a
/// fixed-seed generator, so the figures repeat.
pub fn poisson_log(rates: &[f64], k: f64, window: usize, seed: u64) -> Vec<f64> {
    let n = rates.len();
    let mut prefix = vec![0.0; n + 1];
    for (i, r) in rates.iter().enumerate() {
        prefix[i + 1] = prefix[i] + r;
    }
    let half = window.max(1) / 2;
    let mut state = seed | 1;
    let mut uniform = move || {
        // xorshift64*: enough for a bench's noise.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|s| {
            let (lo, hi) = (s.saturating_sub(half), (s + half).min(n - 1));
            let lam = k * (prefix[hi + 1] - prefix[lo]) / (hi + 1 - lo) as f64;
            if lam <= 0.0 {
                0.0
            } else if lam < 30.0 {
                // Knuth: count uniforms until their product drops below e^-λ.
                let (limit, mut p, mut c) = ((-lam).exp(), 1.0, 0.0);
                loop {
                    p *= uniform();
                    if p <= limit {
                        break c;
                    }
                    c += 1.0;
                }
            } else {
                // Normal approximation (Box–Muller), rounded.
                let (u1, u2) = (uniform().max(1e-300), uniform());
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                (lam + lam.sqrt() * z).round().max(0.0)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
        2023-11-16 18:17:05.0000001,10,1\n\
        2023-11-16 18:17:03.9799600,4808,10\n\
        2023-11-16 18:17:04.0319600,3180,8\n\
        2023-11-16 18:17:04.9999999,110,27\n\
        2023-11-16 18:17:03,1,1\n";

    #[test]
    fn request_log_with_seven_digit_fractions_and_unsorted_rows() {
        let t = parse_trace(LOG).unwrap();
        assert_eq!(t.arrivals, vec![2.0, 2.0, 1.0]);
        assert_eq!(t.len(), 3);
        assert_eq!(t.kind, TraceKind::RequestLog { requests: 5 });
        assert_eq!(t.t0_label, "2023-11-16 18:17:03");
    }

    #[test]
    fn request_log_t0_drops_the_fraction_of_the_earliest_timestamp() {
        // Earliest is 10.9: t0 = 10, so 11.1 falls in second 1, not second 0.
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n\
            2024-02-29 23:59:10.9,1,1\r\n2024-02-29 23:59:11.1,1,1\r\n2024-03-01 00:00:00,1,1\r\n";
        let t = parse_trace(text).unwrap();
        assert_eq!(t.len(), 51);
        assert_eq!(t.arrivals[0], 1.0);
        assert_eq!(t.arrivals[1], 1.0);
        assert_eq!(t.arrivals[50], 1.0);
        assert_eq!(t.total_arrivals(), 3.0);
    }

    #[test]
    fn request_log_across_a_year_boundary() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
            1999-12-31 23:59:59.5,1,1\n2000-01-01 00:00:01,1,1\n";
        let t = parse_trace(text).unwrap();
        assert_eq!(t.arrivals, vec![1.0, 0.0, 1.0]);
        assert_eq!(t.t0_label, "1999-12-31 23:59:59");
    }

    #[test]
    fn request_log_with_zones_and_iso_separator_is_read_in_utc() {
        // Another export of the same log: `T` separator, explicit zones. 18:17:03 UTC is the
        // earliest; +01:00 and -0130 shift their rows onto the same UTC seconds.
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
            2023-11-16 18:17:03.5+00:00,1,1\n\
            2023-11-16T18:17:04.25Z,1,1\n\
            2023-11-16 19:17:04+01:00,1,1\n\
            2023-11-16 16:47:06.9-0130,1,1\n\
            2023-11-17 00:17:06+06,1,1\n";
        let t = parse_trace(text).unwrap();
        assert_eq!(t.arrivals, vec![1.0, 2.0, 0.0, 2.0]);
        assert_eq!(t.t0_label, "2023-11-16 18:17:03");
        // A zone past midnight moves the row to the previous UTC day.
        assert_eq!(parse_timestamp("2024-03-01 00:30:00+01:00"), parse_timestamp("2024-02-29 23:30:00"));
    }

    proptest::proptest! {
        // Whatever follows a valid date and time (zones, signs, multi-byte characters), the
        // parser answers without panicking (it found the byte split of a 4-byte zone holding
        // `é`), and a zone it accepts shifts the time by exactly its offset.
        #[test]
        fn any_time_suffix_parses_or_errs_without_panicking(
            suffix in "[+-][0-9:é]{0,5}|[Zz]|\\PC{0,8}",
            h in 0i64..24,
            m in 0i64..60,
        ) {
            let _ = parse_timestamp(&format!("2024-05-10 00:00:00{suffix}"));
            let _ = parse_timestamp(&format!("2024-05-10T00:00:00.5{suffix}"));
            let base = parse_timestamp("2024-05-10 12:00:00").unwrap();
            let east = parse_timestamp(&format!("2024-05-10 12:00:00+{h:02}:{m:02}")).unwrap();
            let west = parse_timestamp(&format!("2024-05-10 12:00:00.25-{h:02}{m:02}")).unwrap();
            proptest::prop_assert_eq!(base - east, h * 3600 + m * 60);
            proptest::prop_assert_eq!(west - base, h * 3600 + m * 60);
        }
    }

    #[test]
    fn civil_round_trip() {
        for &(y, m, d) in
            &[(0, 3, 1), (1, 1, 1), (1970, 1, 1), (2000, 2, 29), (2023, 11, 16), (2100, 3, 1), (9999, 12, 31)]
        {
            assert_eq!(civil_from_days(days_from_civil(y, m, d)), (y, m, d));
        }
        // Unix epoch sanity: 1970-01-01 → 2000-03-01 is 11017 days.
        assert_eq!(days_from_civil(2000, 3, 1) - days_from_civil(1970, 1, 1), 11_017);
        assert_eq!(days_from_civil(0, 1, 1), -60);
    }

    #[test]
    fn bad_timestamps_name_line_and_column() {
        for bad in [
            "2023-11-16_18:17:03",
            "2023-11-16 18:17:03+5",
            "2023-11-16 18:17:03+24:00",
            "2023-11-16 18:17:03.5+00:6a",
            "2023-11-16 18:17:03.5+",
            "2023-11-16 18:17:03+1é1",
            "2023-11-16 18:17:03-é12",
            "2023-11-16 18:17:03 UTC",
            "2023-13-16 18:17:03",
            "2023-02-29 18:17:03",
            "2023-11-16 24:00:00",
            "2023-11-16 18:17:03.",
            "2023-11-16 18:17:03.12a",
            "23-11-16 18:17:03",
            "",
        ] {
            let text = format!("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,1,1\n{bad},1,1\n");
            match parse_trace(&text) {
                Err(TraceError::BadTimestamp { line: 3, column: 1, .. }) => {}
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn bad_token_count_and_missing_column() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,1,x\n";
        assert!(matches!(
            parse_trace(text),
            Err(TraceError::BadNumber { line: 2, column: 3, name: "GeneratedTokens", .. })
        ));
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n\n2023-11-16 18:17:03,1\n";
        let err = parse_trace(text).unwrap_err();
        assert_eq!(err, TraceError::MissingField { line: 3, column: 3, name: "GeneratedTokens", got: 2 });
        assert!(err.to_string().contains("line 3"));
    }

    #[test]
    fn rate_series() {
        let text = "window_start_s,rate_rps\n100,1.5\n103,0\n104,2\n";
        let t = parse_trace(text).unwrap();
        // width 3: [100,103) 1.5, [103,104) 0, [104,107) 2 → T = 104 + 3 − 100 = 7
        assert_eq!(t.arrivals, vec![1.5, 1.5, 1.5, 0.0, 2.0, 2.0, 2.0]);
        assert_eq!(t.kind, TraceKind::RateSeries { window_s: 3 });
        assert_eq!(t.t0_label, "100");
        assert_eq!(t.truncated(2).arrivals, vec![1.5, 1.5]);
        assert_eq!(t.truncated(99).len(), 7);
    }

    #[test]
    fn rate_series_errors() {
        let e = |t: &str| parse_trace(t).unwrap_err();
        assert_eq!(
            e("window_start_s,rate_rps\n0,1\n10,1\n10,2\n"),
            TraceError::NonIncreasingStart { line: 4, start: 10, previous: 10 }
        );
        assert_eq!(e("window_start_s,rate_rps\n0,1\n10,-0.5\n"), TraceError::NegativeRate { line: 3, value: -0.5 });
        assert!(matches!(
            e("window_start_s,rate_rps\n0,NaN\n10,1\n"),
            TraceError::BadNumber { line: 2, column: 2, .. }
        ));
        assert!(matches!(
            e("window_start_s,rate_rps\n0.5,1\n10,1\n"),
            TraceError::BadNumber { line: 2, column: 1, .. }
        ));
        assert_eq!(e("window_start_s,rate_rps\n\n0,1\n"), TraceError::SingleWindow { line: 3 });
        assert_eq!(e("window_start_s,rate_rps\n"), TraceError::NoRows { line: 1 });
        assert!(matches!(e("window_start_s,rate_rps\n0,1\n99999999999,1\n"), TraceError::TooLong { .. }));
    }

    #[test]
    fn empty_and_unknown_header() {
        assert_eq!(parse_trace(""), Err(TraceError::Empty));
        assert_eq!(parse_trace("\n  \n"), Err(TraceError::Empty));
        assert!(matches!(parse_trace("time,rate\n0,1\n"), Err(TraceError::UnknownHeader { line: 1, .. })));
        assert!(matches!(parse_trace("TIMESTAMP,ContextTokens\n"), Err(TraceError::UnknownHeader { .. })));
    }

    #[test]
    fn bom_quotes_and_extra_columns_are_accepted() {
        let text = "\u{feff}window_start_s,rate_rps,note\n\"0\", 1 ,a\n2,3,b\n";
        let t = parse_trace(text).unwrap();
        assert_eq!(t.arrivals, vec![1.0, 1.0, 3.0, 3.0]);
    }

    #[test]
    fn reader_matches_str() {
        let a = parse_trace(LOG).unwrap();
        let b = read_trace(std::io::Cursor::new(LOG.as_bytes())).unwrap();
        assert_eq!(a, b);
        let bad: &[u8] = b"window_start_s,rate_rps\n0,\xff\n";
        assert!(matches!(read_trace(std::io::Cursor::new(bad)), Err(TraceError::Io { line: 2, .. })));
    }

    #[test]
    fn from_rates() {
        let t = trace_from_rates(2, &[1.0, f64::NAN, -3.0, 0.5]);
        assert_eq!(t.arrivals, vec![1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5]);
        assert_eq!(t.kind, TraceKind::RateSeries { window_s: 2 });
        assert!(trace_from_rates(0, &[1.0]).is_empty());
        assert!(try_trace_from_rates(2, &[1.0, -1.0]).is_err());
        assert!(try_trace_from_rates(0, &[1.0]).is_err());
        assert_eq!(try_trace_from_rates(2, &[1.0, 2.0]).unwrap().len(), 4);
    }
}
