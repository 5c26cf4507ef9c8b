"""The conda path produced an environment with the pinned Python and the pinned packages."""


def test_conda_created_the_env(host):
    assert host.file("/opt/miniforge3/bin/conda").exists
    meta = host.file("/opt/gpubox/conda-env/conda-meta")
    assert meta.is_directory
    assert host.file("/opt/gpubox/conda-env/bin/python").exists


def test_python_version_is_pinned(host):
    out = host.check_output("/opt/gpubox/conda-env/bin/python -c 'import sys; print(sys.version_info[:2])'")
    assert out.strip() == "(3, 10)"


def test_pinned_package_installed_by_pip(host):
    out = host.check_output("/opt/gpubox/conda-env/bin/python -m pip show packaging")
    assert "Version: 24.2" in out
