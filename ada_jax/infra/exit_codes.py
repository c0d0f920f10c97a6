"""Exit codes of the commands (`python -m ada_jax.<command>`), in one place.

The main job's code tells a wrapper (`ada_jax.sweep --run`,
`launch_tpu.sh status`, a cluster scheduler) what to do next:

| code | meaning | what to do |
|---|---|---|
| 0 | finished | nothing |
| 1 | failed (an error; e.g. a checkpoint that could not be written) | read the log, fix, rerun: it resumes |
| 2 | bad input found before anything was written (config key or value, file, usage) | fix the command |
| 73 | busy: another live process holds the run directory's lease (`infra.lease`); nothing written | wait for it to end, or stop it; a dead holder's lease is taken over |
| 75 | stopped by a signal (SIGTERM, SIGINT, preemption) after saving a checkpoint of the last completed step, or at once without one where that write would not fit the preemption notice | rerun the same command: it resumes (from the step the run's last line names) |

73 is sysexits' EX_CANTCREAT ("a file cannot be created"). 75 is
sysexits' EX_TEMPFAIL ("a temporary failure; the user is invited to
retry"). A run killed without warning (SIGKILL: 137 from a shell) also
resumes, from its last periodic checkpoint.
"""

OK = 0
FAILED = 1
BAD_INPUT = 2
BUSY = 73
STOPPED = 75

MEANINGS: dict[int, str] = {
  OK: 'finished',
  FAILED: 'failed',
  BAD_INPUT: 'bad input (nothing written)',
  BUSY: 'busy: another process holds the run (nothing written)',
  STOPPED: 'stopped after a checkpoint (resumable: rerun the same command)',
}
