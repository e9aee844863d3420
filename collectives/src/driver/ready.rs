//! Which of a set of sockets are ready: one `poll(2)` over all of them,
//! for rank 0, which holds one TCP stream per rank.

use std::os::fd::BorrowedFd;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// Those of `open` whose socket (`fd_of`) is ready for `flags`, or has
/// failed or closed, after waiting up to `timeout` for one. A failed poll
/// (interrupted, out of memory) gives all of them: the caller tries each.
pub(super) fn ready<'a>(
    open: Vec<usize>,
    fd_of: impl Fn(usize) -> BorrowedFd<'a>,
    flags: PollFlags,
    timeout: PollTimeout,
) -> Vec<usize> {
    let mut fds: Vec<PollFd<'a>> = open.iter().map(|&i| PollFd::new(fd_of(i), flags)).collect();
    match poll(&mut fds, timeout) {
        Ok(0) => Vec::new(),
        Ok(_) => open
            .iter()
            .zip(&fds)
            .filter(|(_, f)| f.revents().is_some_and(|r| !r.is_empty()))
            .map(|(&i, _)| i)
            .collect(),
        Err(_) => open,
    }
}
