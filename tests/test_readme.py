"""The README's example runs as written (on the CPU, over a small generated image folder)."""

import pathlib

import numpy as np
from PIL import Image

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(tmp_path, monkeypatch, capsys):
    for cls in ("cat", "dog"):
        (tmp_path / "data" / cls).mkdir(parents=True)
        for i in range(40):
            pixels = (np.random.default_rng(i).random((60, 80, 3)) * 255).astype("uint8")
            Image.fromarray(pixels).save(tmp_path / "data" / cls / f"{i:03d}.jpg")
    (tmp_path / "data" / "dog" / "bad.jpg").write_bytes(b"not a jpeg")
    code = README.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    assert 'device="cuda"' in code and "    ...\n" in code
    code = code.replace('device="cuda"', 'device="cpu"').replace("    ...\n", "    seen.append((images, labels))\n")
    monkeypatch.chdir(tmp_path)
    namespace = {"seen": []}
    exec(compile(code, str(README), "exec"), namespace)
    images, labels = namespace["seen"][0]
    assert tuple(images.shape) == (32, 3, 224, 224) and str(images.dtype) == "torch.uint8"
    assert tuple(labels.shape) == (32,) and set(labels.tolist()) <= {0, 1}
    assert sum(len(lbl) for _, lbl in namespace["seen"]) == 80  # the corrupt file was skipped
    assert "bottleneck" in capsys.readouterr().out
