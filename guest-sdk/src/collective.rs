//! Collective operations built on `send` and `sync`: every process of the
//! job calls the same one at the same point, and each takes exactly one
//! superstep (it ends the current one with a sync).
//!
//! Results are deterministic: values are combined in pid order, so every
//! process (and every run, and every restore from a checkpoint) computes
//! the same result, also for operations that are not associative in
//! floating point.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bsp::{Bsp, Message};
use crate::{Error, Result};

impl Bsp {
    /// Every process's `value`, indexed by pid. Ends the current superstep.
    ///
    /// Send nothing else in the superstep that calls it: a second message
    /// from a process is an error, because it could not be told apart.
    ///
    /// ```rust,no_run
    /// # async fn f(bsp: &mut bspweb::Bsp) -> bspweb::Result<()> {
    /// let counts: Vec<u64> = bsp.all_gather(&(bsp.pid() as u64 * 10)).await?;
    /// assert_eq!(counts.len(), bsp.nprocs() as usize);
    /// # Ok(()) }
    /// ```
    pub async fn all_gather<T: Serialize + DeserializeOwned>(
        &mut self,
        value: &T,
    ) -> Result<Vec<T>> {
        self.send_range(.., value)?;
        self.sync().await;
        one_per_pid(self.messages(), self.nprocs(), "all_gather")
    }

    /// `op` applied to every process's `value` in pid order
    /// (`op(op(v0, v1), v2)…`); every process gets the result. Ends the
    /// current superstep.
    ///
    /// ```rust,no_run
    /// # async fn f(bsp: &mut bspweb::Bsp, partial: f64) -> bspweb::Result<()> {
    /// let total = bsp.all_reduce(partial, |a, b| a + b).await?;
    /// # Ok(()) }
    /// ```
    pub async fn all_reduce<T, F>(&mut self, value: T, op: F) -> Result<T>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(T, T) -> T,
    {
        let all = self.all_gather(&value).await?;
        drop(value);
        fold(all, op)
    }

    /// `op` applied to every process's `value` in pid order, at process
    /// `root` only: it gets `Some(result)`, the others `None`. Ends the
    /// current superstep; only `root` receives messages in it.
    pub async fn reduce<T, F>(&mut self, root: u32, value: T, op: F) -> Result<Option<T>>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(T, T) -> T,
    {
        self.send(root, &value)?;
        drop(value);
        self.sync().await;
        if self.pid() != root {
            return Ok(None);
        }
        let all = one_per_pid(self.messages(), self.nprocs(), "reduce")?;
        fold(all, op).map(Some)
    }
}

/// `op` over `values` in order.
fn fold<T, F: FnMut(T, T) -> T>(values: Vec<T>, op: F) -> Result<T> {
    values
        .into_iter()
        .reduce(op)
        .ok_or_else(|| Error::msg("a collective operation over no processes"))
}

/// One decoded message from each of `nprocs` pids, indexed by pid.
fn one_per_pid<T: DeserializeOwned>(
    messages: &[Message],
    nprocs: u32,
    what: &str,
) -> Result<Vec<T>> {
    let mut out: Vec<Option<T>> = (0..nprocs).map(|_| None).collect();
    for m in messages {
        let slot = out.get_mut(m.source() as usize).ok_or_else(|| {
            Error::msg(format!(
                "{what}: a message from pid {}, which does not exist",
                m.source()
            ))
        })?;
        if slot.is_some() {
            return Err(Error::msg(format!(
                "{what}: more than one message from pid {} in its superstep; send nothing else in the superstep that calls {what} (sync first)",
                m.source()
            )));
        }
        *slot = Some(m.decode()?);
    }
    out.into_iter()
        .enumerate()
        .map(|(pid, v)| {
            v.ok_or_else(|| {
                Error::msg(format!(
                    "{what}: nothing arrived from pid {pid}; every process must call {what} at the same point"
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bsp::tests::msg;

    fn enc<T: Serialize>(v: &T) -> Vec<u8> {
        postcard::to_allocvec(v).unwrap()
    }

    #[test]
    fn one_value_per_pid_in_pid_order() {
        let msgs = vec![
            msg(0, &enc(&10u64)),
            msg(1, &enc(&11u64)),
            msg(2, &enc(&12u64)),
        ];
        let got: Vec<u64> = one_per_pid(&msgs, 3, "all_gather").unwrap();
        assert_eq!(got, [10, 11, 12]);
        assert_eq!(fold(got, |a, b| a * 100 + b).unwrap(), 101_112);
    }

    #[test]
    fn extra_or_missing_messages_are_errors_that_say_what_to_do() {
        let twice = vec![msg(0, &enc(&1u8)), msg(0, &enc(&2u8)), msg(1, &enc(&3u8))];
        let e = one_per_pid::<u8>(&twice, 2, "all_gather")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("more than one message from pid 0") && e.contains("sync first"),
            "{e}"
        );
        let missing = vec![msg(0, &enc(&1u8))];
        let e = one_per_pid::<u8>(&missing, 2, "reduce")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nothing arrived from pid 1"), "{e}");
        let bad = vec![msg(0, b"\xff\xff\xff\xff\xff\xff"), msg(1, &enc(&3u8))];
        assert!(one_per_pid::<u8>(&bad, 2, "reduce").is_err());
    }

    /// Against a model: folding in pid order equals the sequential left
    /// fold, for a non-commutative operation and any number of pids.
    #[test]
    fn the_fold_is_the_sequential_left_fold() {
        for n in 1..20u32 {
            let msgs: Vec<Message> = (0..n).map(|p| msg(p, &enc(&format!("{p},")))).collect();
            let got: Vec<String> = one_per_pid(&msgs, n, "all_gather").unwrap();
            let folded = fold(got, |a, b| a + &b).unwrap();
            let model: String = (0..n).map(|p| format!("{p},")).collect();
            assert_eq!(folded, model);
        }
    }
}
