//! When a volunteer's peer takes work: not while paused (`bspweb peer
//! pause`), and only inside its time-of-day windows (`--run-between`). A
//! peer that should not take work *drains*: the supernode moves its
//! processes away and gives it no new ones; when it may again, it resumes.
//!
//! The window rules here are pure: the caller passes the local minute of
//! the day ([`local_minute_of_day`] reads it).

use std::fmt;
use std::str::FromStr;

/// A daily time window in local time, `start..end` in minutes since
/// midnight; one that ends before it starts spans midnight (`22:00-07:00`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start: u16,
    pub end: u16,
}

const DAY: u16 = 24 * 60;

impl Window {
    /// Whether `minute` (0..1440) lies in the window (start inclusive, end
    /// exclusive). `00:00-24:00` is the whole day.
    pub fn contains(self, minute: u16) -> bool {
        if self.start <= self.end {
            (self.start..self.end).contains(&minute)
        } else {
            minute >= self.start || minute < self.end
        }
    }
}

/// Whether a peer with these windows may take work at `minute`: always
/// without windows, else inside any of them.
pub fn allowed(windows: &[Window], minute: u16) -> bool {
    windows.is_empty() || windows.iter().any(|w| w.contains(minute))
}

/// `HH:MM` (24 h; `24:00` only as an end) as minutes since midnight.
fn parse_time(s: &str, end: bool) -> Result<u16, String> {
    let bad = || format!("`{s}` is not a time of day; write HH:MM, e.g. 07:30 or 22:00");
    let (h, m) = s.trim().split_once(':').ok_or_else(bad)?;
    if h.is_empty() || h.len() > 2 || m.len() != 2 {
        return Err(bad());
    }
    let h: u16 = h.parse().map_err(|_| bad())?;
    let m: u16 = m.parse().map_err(|_| bad())?;
    if m >= 60 || h > 24 || (h == 24 && (m != 0 || !end)) {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

impl FromStr for Window {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (a, b) = s.split_once('-').ok_or_else(|| {
            format!("`{s}` is not a time window; write START-END in local time, e.g. 22:00-07:00")
        })?;
        let w = Window {
            start: parse_time(a, false)?,
            end: parse_time(b, true)?,
        };
        if w.start == w.end {
            return Err(format!(
                "`{s}` is an empty window; for the whole day leave --run-between out"
            ));
        }
        Ok(w)
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:02}:{:02}-{:02}:{:02}",
            self.start / 60,
            self.start % 60,
            self.end / 60,
            self.end % 60
        )
    }
}

/// The slots a peer may use under a CPU cap of `percent` of its `cores`:
/// at least one, at most `slots`.
pub fn capped_slots(slots: usize, cores: usize, percent: Option<u8>) -> usize {
    match percent {
        None => slots,
        Some(p) => {
            let cap = (cores * usize::from(p)).div_ceil(100).max(1);
            slots.min(cap).max(1)
        }
    }
}

/// The local minute of the day (0..1440), from the system's time zone
/// (off Unix: UTC).
pub fn local_minute_of_day() -> u16 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    #[cfg(not(unix))]
    return ((now / 60) % u64::from(DAY)) as u16;
    #[cfg(unix)]
    local_minute_unix(now)
}

#[cfg(unix)]
fn local_minute_unix(now: u64) -> u16 {
    let Ok(t) = libc::time_t::try_from(now) else {
        return 0;
    };
    // SAFETY: `tm` is a plain C struct for which all zero bytes are valid.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: localtime_r is the reentrant form: it writes only into `tm`,
    // which we own, and reads `t`; it returns null on failure, checked.
    let ok = unsafe { !libc::localtime_r(&t, &mut tm).is_null() };
    if !ok {
        // Unknown time zone: UTC.
        return ((now / 60) % u64::from(DAY)) as u16;
    }
    (tm.tm_hour.clamp(0, 23) * 60 + tm.tm_min.clamp(0, 59)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse_print_and_span_midnight() {
        let night: Window = "22:00-07:00".parse().unwrap();
        assert_eq!(night.to_string(), "22:00-07:00");
        assert!(night.contains(23 * 60));
        assert!(night.contains(0));
        assert!(night.contains(6 * 60 + 59));
        assert!(!night.contains(7 * 60));
        assert!(!night.contains(12 * 60));
        let day: Window = "9:30-17:00".parse().unwrap();
        assert!(day.contains(9 * 60 + 30) && !day.contains(9 * 60 + 29));
        assert!(!day.contains(17 * 60));
        let all: Window = "00:00-24:00".parse().unwrap();
        assert!((0..DAY).all(|m| all.contains(m)));
        for bad in [
            "",
            "22:00",
            "25:00-01:00",
            "10:60-11:00",
            "24:00-01:00",
            "1:2-3:00",
            "08:00-08:00",
            "a:00-b:00",
        ] {
            assert!(bad.parse::<Window>().is_err(), "{bad}");
        }
    }

    /// Against a model: a minute is allowed exactly when some window covers
    /// it, minute by minute over the whole day.
    #[test]
    fn allowed_matches_a_minute_by_minute_model() {
        let windows: Vec<Window> = ["22:00-07:00", "12:00-13:30"]
            .iter()
            .map(|w| w.parse().unwrap())
            .collect();
        let mut model = vec![false; usize::from(DAY)];
        for m in (22 * 60)..DAY {
            model[usize::from(m)] = true;
        }
        for m in 0..(7 * 60u16) {
            model[usize::from(m)] = true;
        }
        for m in (12 * 60u16)..(13 * 60 + 30) {
            model[usize::from(m)] = true;
        }
        for m in 0..DAY {
            assert_eq!(allowed(&windows, m), model[usize::from(m)], "minute {m}");
        }
        assert!((0..DAY).all(|m| allowed(&[], m)));
    }

    #[test]
    fn a_cpu_cap_leaves_at_least_one_slot() {
        assert_eq!(capped_slots(8, 8, None), 8);
        assert_eq!(capped_slots(8, 8, Some(50)), 4);
        assert_eq!(capped_slots(8, 8, Some(30)), 3);
        assert_eq!(capped_slots(8, 8, Some(1)), 1);
        assert_eq!(capped_slots(2, 8, Some(100)), 2);
        assert_eq!(capped_slots(4, 4, Some(100)), 4);
    }

    #[test]
    fn the_local_minute_is_within_the_day() {
        assert!(local_minute_of_day() < DAY);
    }
}
