"""The ImageNet evaluation transforms of OFA, SPOS and AutoFormer, and the seeded augmentation
their BatchNorm recalibration runs on, as each paper's public code does it.

Images come out as uint8 (size, size, 3) arrays, so a bounded cache can hold them; `finish`
turns a batch of them into the network's input on the device (normalised RGB, or SPOS's
unnormalised BGR). Sources read:

* OFA: `ofa/imagenet_classification/data_providers/imagenet.py` (the `ofa` package):
  validation resizes the shorter side to ceil(r / 0.875) (bilinear) and centre-crops r, per
  subnet resolution r; BN statistics are re-estimated on 2,000 training images chosen by a
  permutation seeded with `SUB_SEED` (937162211), with the training transform: random resized
  crop (scale 0.08-1), flip and colour jitter (brightness 32/255, saturation 0.5, its "tf"
  setting, also that of `ofa/tutorial/imagenet_eval_helper.py`'s `calib_bn`).
* SPOS: megvii's `OneShot/train.py` (ShuffleNet-Series) and `SinglePathOneShot`'s
  `train.py`: OpenCV's bilinear resize of the shorter side to 256 (the longer rounded to
  nearest), centre crop 224, then `ToBGRTensor`: BGR, 0-255 floats, no normalisation. Training
  crops: random resized crop, colour jitter 0.4/0.4/0.4, flip. OpenCV is not a dependency: its
  INTER_LINEAR (half-pixel centres, no antialiasing) is torch's bilinear without antialiasing,
  rounded half up, within one grey level of OpenCV's fixed-point result.
* AutoFormer: microsoft/Cream `AutoFormer/lib/datasets.py` `build_transform`: shorter side to
  int(256 / 224 * r) with bicubic (`interpolation=3`), centre crop r, timm's ImageNet mean/std.
  A ViT with LayerNorm only: nothing to recalibrate (the augmentation is never used).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms.functional as TF
from PIL import Image
from torchvision.transforms import InterpolationMode

from nas.data.normalise import Normaliser

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # torchvision's and timm's IMAGENET_DEFAULT_MEAN / STD
IMAGENET_STD = (0.229, 0.224, 0.225)
OFA_SUB_SEED = 937162211  # ofa DataProvider.SUB_SEED: which training images recalibrate BN


def _crop_box(height: int, width: int, size: int) -> tuple[int, int]:
    """(top, left) of torchvision's CenterCrop (Python's round: halves to even)."""
    return int(round((height - size) / 2.0)), int(round((width - size) / 2.0))


def _array(img: Image.Image) -> np.ndarray:
    return np.asarray(img, dtype=np.uint8)


def opencv_linear(arr: np.ndarray, height: int, width: int) -> np.ndarray:
    """`cv2.resize(arr, (width, height), interpolation=cv2.INTER_LINEAR)` for uint8 (H, W, 3)."""
    x = torch.from_numpy(np.array(arr)).permute(2, 0, 1)[None].float()
    y = F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False, antialias=False)
    return (y + 0.5).floor_().clamp_(0, 255)[0].permute(1, 2, 0).to(torch.uint8).numpy()


def random_resized_box(rng: np.random.Generator, height: int, width: int, scale: tuple[float, float] = (0.08, 1.0),
                       ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(top, left, h, w) as torchvision's RandomResizedCrop draws it, from `rng`."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


@dataclass(frozen=True)
class PaperTransform:
    """One paper's evaluation transform and recalibration augmentation."""

    name: str
    resize: Callable[[int], int]  # the shorter side before the centre crop of `size`
    interpolation: InterpolationMode | None  # None: OpenCV's bilinear (SPOS)
    bgr_255: bool  # SPOS's ToBGRTensor: BGR channels, 0-255, not normalised
    jitter: tuple[float, float, float]  # recalibration colour jitter: brightness, contrast, saturation

    def eval_image(self, img: Image.Image, size: int, _k: int = 0) -> np.ndarray:
        """Resize the shorter side, centre-crop `size`: uint8 (size, size, 3)."""
        short = self.resize(size)
        width, height = img.size
        if self.interpolation is None:
            h, w = ((short, int(short / height * width + 0.5)) if height < width
                    else (int(short / width * height + 0.5), short))
            arr = opencv_linear(_array(img), h, w)
        else:
            arr = _array(TF.resize(img, short, self.interpolation))
        top, left = _crop_box(arr.shape[0], arr.shape[1], size)
        return np.ascontiguousarray(arr[top:top + size, left:left + size])

    def recal_image(self, seed: int) -> Callable[[Image.Image, int, int], np.ndarray]:
        """The paper's training augmentation, drawn for image `k` at `size` from (seed, size, k):
        the same crops for every subnet, as OFA's cached sub-train loader feeds them."""

        def augment(img: Image.Image, size: int, k: int) -> np.ndarray:
            rng = np.random.default_rng([seed, size, k])
            top, left, h, w = random_resized_box(rng, img.size[1], img.size[0])
            out = TF.resized_crop(img, top, left, h, w, [size, size], InterpolationMode.BILINEAR)
            if rng.uniform() < 0.5:  # a flip commutes with the jitter (OFA flips first, SPOS after)
                out = TF.hflip(out)
            return np.ascontiguousarray(_array(self._jitter(out, rng)))

        return augment

    def _jitter(self, img: Image.Image, rng: np.random.Generator) -> Image.Image:
        """torchvision's ColorJitter: the enabled adjustments in a random order, factors in [1-x, 1+x]."""
        adjust = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation)
        for i in rng.permutation(3):
            if self.jitter[i]:
                img = adjust[i](img, float(rng.uniform(max(0.0, 1 - self.jitter[i]), 1 + self.jitter[i])))
        return img

    def finish(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (B, 3, H, W) RGB on the device -> the network's input batch."""
        if self.bgr_255:
            return images.flip(1).float()
        return Normaliser(IMAGENET_MEAN, IMAGENET_STD, images.device).images(images)


TRANSFORMS = {
    "ofa": PaperTransform("ofa", lambda r: int(math.ceil(r / 0.875)), InterpolationMode.BILINEAR, False,
                          (32 / 255, 0.0, 0.5)),
    "spos": PaperTransform("spos", lambda r: int(256 / 224 * r + 0.5), None, True, (0.4, 0.4, 0.4)),
    "autoformer": PaperTransform("autoformer", lambda r: int((256 / 224) * r), InterpolationMode.BICUBIC, False,
                                 (0.0, 0.0, 0.0)),
}
# A space's paper: the transform `data.transform: auto` picks.
SPACE_TRANSFORMS = {"ofa_mbv3": "ofa", "spos": "spos", "autoformer": "autoformer"}
