"""Fine-tune a small object detector on a COCO-format folder with fastdata.

The COCO folder (images + ``instances_*.json``) is preprocessed once into uint8 shards at
one size (``resize="pad"``: letterboxed, boxes scaled and shifted with the image); training
reads batches of images ``(B, 3, S, S)`` uint8 with a list of ``(N_i, 4)`` float32 xyxy
boxes and a list of ``(N_i,)`` int64 labels, augmented in the workers (IoU crop, flip,
resize: the boxes move with the pixels). The model is a tiny CenterNet-style detector in
plain PyTorch (a class heatmap, box sizes and centre offsets at stride 4), small enough to
train on a CPU; torchvision's Faster R-CNN takes the same batches (see
``docs/guides/detection.md``). Run it twice with ``--weights`` to fine-tune what the first
run saved::

    python examples/detection_finetune.py coco/images coco/instances_train.json work/ \\
        --image-size 128 --epochs 5 --save work/detector.pt
    python examples/detection_finetune.py coco/images coco/instances_train.json work/ \\
        --weights work/detector.pt --lr 1e-3
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's spelling)
from torch import nn

from fastdata.datasets import ShardDataset
from fastdata.gpu import Normalize, to_device
from fastdata.preprocess import CocoDetection, PreprocessOptions, preprocess
from fastdata.transforms import Compose, RandomHorizontalFlip, RandomIoUCrop, Resize

STRIDE = 4  # the heatmap's cell, in input pixels


class TinyCenterNet(nn.Module):
    """Three convolutions to stride 4, then per cell: a heatmap of box centres per class,
    the box's size and the centre's offset within the cell (both in cells)."""

    def __init__(self, num_classes: int, width: int = 32) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
        )  # fmt: skip
        self.heatmap = nn.Conv2d(width, num_classes, 1)
        self.size_offset = nn.Conv2d(width, 4, 1)
        nn.init.constant_(self.heatmap.bias, -2.19)  # sigmoid 0.1: CenterNet's start

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.backbone(images)
        return self.heatmap(features), self.size_offset(features)


def centre_targets(
    boxes: Sequence[torch.Tensor], labels: Sequence[torch.Tensor], num_classes: int, cells: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training targets of a batch from its boxes (lists of ``(N_i, 4)`` xyxy pixels).

    Returns:
        heatmap ``(B, K, C, C)``: a Gaussian peak of 1 at each box centre's cell;
        ``index`` ``(M, 4)`` (image, class, row, col) of every centre; ``size_offset``
        ``(M, 4)`` its box's width, height and sub-cell offset (in cells); the number of
        boxes (at least 1, the loss's divisor).
    """
    device = boxes[0].device if boxes else torch.device("cpu")
    heatmap = torch.zeros(len(boxes), num_classes, cells, cells, device=device)
    grid = torch.arange(cells, device=device, dtype=torch.float32)
    indices, targets = [], []
    for image, (image_boxes, image_labels) in enumerate(zip(boxes, labels, strict=True)):
        cell_boxes = image_boxes.float() / STRIDE
        centres = (cell_boxes[:, :2] + cell_boxes[:, 2:]) / 2
        sizes = (cell_boxes[:, 2:] - cell_boxes[:, :2]).clamp(min=1e-3)
        cell = centres.floor().clamp(0, cells - 1)
        sigma = (sizes / 6).clamp(min=0.5)  # wider boxes, wider peaks
        for (cx, cy), (sx, sy), label in zip(cell, sigma, image_labels, strict=True):
            peak = torch.exp(-((grid - cx) ** 2)[None, :] / (2 * sx**2)
                             - ((grid - cy) ** 2)[:, None] / (2 * sy**2))  # fmt: skip
            heatmap[image, label] = torch.maximum(heatmap[image, label], peak)
        rows = torch.full((len(cell),), image, device=device)
        indices.append(torch.stack([rows, image_labels, cell[:, 1].long(), cell[:, 0].long()], 1))
        targets.append(torch.cat([sizes, centres - cell], dim=1))
    index = torch.cat(indices) if indices else torch.zeros(0, 4, dtype=torch.long)
    size_offset = torch.cat(targets) if targets else torch.zeros(0, 4)
    return heatmap, index.long(), size_offset, torch.tensor(max(len(index), 1), device=device)


def detection_loss(
    outputs: tuple[torch.Tensor, torch.Tensor],
    boxes: Sequence[torch.Tensor],
    labels: Sequence[torch.Tensor],
) -> torch.Tensor:
    """CenterNet's loss: focal loss on the heatmap, L1 on sizes and offsets at centres."""
    logits, size_offset = outputs
    heatmap, index, target, count = centre_targets(boxes, labels, logits.shape[1], logits.shape[-1])
    p = logits.sigmoid().clamp(1e-4, 1 - 1e-4)
    positive = heatmap.eq(1).float()
    focal = -(positive * (1 - p) ** 2 * p.log()
              + (1 - positive) * (1 - heatmap) ** 4 * p**2 * (1 - p).log()).sum()  # fmt: skip
    images, _, rows, cols = index.unbind(1)
    predicted = size_offset[images, :, rows, cols]  # (M, 4) at each centre
    regression = F.l1_loss(predicted, target, reduction="sum")
    return (focal + 0.1 * regression) / count


@torch.no_grad()
def detect(
    model: TinyCenterNet, images: torch.Tensor, top_k: int = 20, threshold: float = 0.3
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(boxes (N, 4) xyxy pixels, scores (N,), labels (N,))`` per image: heatmap peaks
    (a 3x3 max-pool keeps local maxima) above ``threshold``."""
    logits, size_offset = model(images)
    heat = logits.sigmoid()
    heat = heat * (F.max_pool2d(heat, 3, stride=1, padding=1) == heat)
    batch, _, cells, _ = heat.shape
    scores, flat = heat.flatten(1).topk(min(top_k, heat[0].numel()))
    out = []
    for image in range(batch):
        keep = scores[image] > threshold
        where = flat[image][keep]
        label, row, col = where // (cells * cells), where // cells % cells, where % cells
        width, height, dx, dy = size_offset[image][:, row, col]
        cx, cy = col + dx, row + dy
        boxes = torch.stack([cx - width / 2, cy - height / 2, cx + width / 2, cy + height / 2], 1)
        out.append((boxes * STRIDE, scores[image][keep], label))
    return out


def box_recall(
    predictions: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    boxes: Sequence[torch.Tensor],
    labels: Sequence[torch.Tensor],
    iou: float = 0.5,
) -> tuple[int, int]:
    """``(found, total)``: ground-truth boxes with a prediction of their class at IoU >= iou."""
    found = total = 0
    for (predicted, _, predicted_labels), truth, truth_labels in zip(
        predictions, boxes, labels, strict=True
    ):
        total += len(truth)
        if not len(truth) or not len(predicted):
            continue
        low = torch.maximum(truth[:, None, :2], predicted[None, :, :2])
        high = torch.minimum(truth[:, None, 2:], predicted[None, :, 2:])
        overlap = (high - low).clamp(min=0).prod(-1)
        area = lambda b: (b[:, 2:] - b[:, :2]).prod(-1)  # noqa: E731
        union = area(truth)[:, None] + area(predicted)[None, :] - overlap
        same = truth_labels[:, None] == predicted_labels[None, :]
        found += int(((overlap / union >= iou) & same).any(1).sum())
    return found, total


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Preprocess (once) and train; returns the mean loss of each epoch."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("images", help="the COCO image folder")
    parser.add_argument("annotations", help="the COCO instances_*.json file")
    parser.add_argument("work", help="folder for the shards (made on the first run)")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weights", help="start from these weights (fine-tuning)")
    parser.add_argument("--save", help="save the trained weights here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    shards = Path(args.work) / "shards"
    if not (shards / "index.json").is_file():  # once: decode, letterbox, scale the boxes
        source = CocoDetection(args.images, args.annotations)
        options = PreprocessOptions(sizes=(args.image_size,), resize="pad")
        preprocess(source, shards, options, workers=max(args.num_workers, 1), show_progress=False)
    # SSD's crop (it keeps boxes overlapping it by a drawn IoU), a flip, back to the size:
    # boxes follow, clipped, and dropped with their labels when little of one is left
    side = args.image_size
    augment = Compose([RandomIoUCrop(), RandomHorizontalFlip(), Resize((side, side))])
    dataset = ShardDataset(shards, fields=("image", "boxes", "labels"), transform=augment)
    loader = dataset.loader(
        batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers, drop_last=True
    )
    model = TinyCenterNet(len(dataset.class_names)).to(device)
    if args.weights:
        model.load_state_dict(torch.load(args.weights, map_location=device))
    normalize = Normalize(mean=[124, 116, 104], std=[58, 57, 57]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    losses = []
    for epoch in range(args.epochs):
        model.train()
        total, batches, found, boxes_seen = 0.0, 0, 0, 0
        for images, boxes, labels in to_device(loader, device):  # uint8; lists of tensors
            outputs = model(normalize(images))
            loss = detection_loss(outputs, boxes, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            model.eval()
            hits = box_recall(detect(model, normalize(images)), boxes, labels)
            model.train()
            total, batches = total + loss.item(), batches + 1
            found, boxes_seen = found + hits[0], boxes_seen + hits[1]
        losses.append(total / max(batches, 1))
        recall = found / max(boxes_seen, 1)
        print(f"epoch {epoch}: {batches} batches, mean loss {losses[-1]:.4f}, recall {recall:.2f}")
    if args.save:
        torch.save(model.state_dict(), args.save)
    return losses


if __name__ == "__main__":
    main()
