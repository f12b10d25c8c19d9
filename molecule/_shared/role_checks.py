"""The checks every role scenario on a staged host root shares (iommu_host,
vfio_host, vgpu_host, guest_nvidia_driver): a scenario's tests/test_default.py
subclasses :class:`RoleChecks` and pytest runs these with its own fixtures
(molecule/conftest.py: ``root``, ``fresh_root``, ``root_var``...).

A role run against a staged root writes only under that root, names no
staging path in what it writes, leaves the captured sysfs/procfs as they were
(runtime writes happen only on a real ``/``), and its check mode reports no
change on a converged root and changes, without writing, on a fresh one.
"""

from __future__ import annotations


class RoleChecks:
    def test_files_do_not_name_the_root_they_were_written_under(self, host, root):
        out = host.run("grep -rl -- %s %s/etc", root, root)
        assert out.stdout == "", out.stdout

    def test_captured_sysfs_and_procfs_untouched(self, root, fresh_root, digest):
        pristine = fresh_root("/srv/pristine")
        for sub in ("sys", "proc"):
            assert digest(f"{root}/{sub}", mtimes=False) == digest(f"{pristine}/{sub}", mtimes=False), sub

    def test_nothing_written_outside_the_root(self, root, outside_root):
        assert outside_root(root) == []

    def test_check_mode_on_the_converged_root_reports_no_change(self, root, converge, digest):
        before = digest(root)
        run = converge(check=True)
        assert run.failures == 0, run.output
        assert run.changed == 0, (run.changed_tasks, run.output)
        assert digest(root) == before

    def test_check_mode_on_a_fresh_root_reports_changes_and_writes_nothing(
        self, converge, fresh_root, root_var, digest
    ):
        fresh = fresh_root("/srv/check-fresh")
        before = digest(fresh)
        run = converge({root_var: fresh}, check=True)
        assert run.failures == 0, run.output
        assert run.changed > 0, run.output
        assert digest(fresh) == before
