"""examples/autotune.ipynb runs top to bottom; its outputs show the table and the plot."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.examples.conftest import EXAMPLES, ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")


def test_autotune_notebook_shows_the_table_and_the_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notebook = nbformat.read(EXAMPLES / "autotune.ipynb", as_version=4)
    parameters = notebook.cells[1]
    assert "TIME_BUDGET_S = " in parameters.source
    parameters.source = parameters.source.replace("TIME_BUDGET_S = 20", "TIME_BUDGET_S = 3")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the kernel imports this checkout's fastdata
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebook's demo folder goes with the test's
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()
    outputs = [
        output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
    ]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o.data["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("<table>" in h and "batches/s" in h and "configuration" in h for h in html)
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the plot
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "configuration" in text and "batches/s" in text  # print(result.table())
    assert "torch.Size([32, 3, 64, 64]) torch.uint8 torch.Size([32])" in text
