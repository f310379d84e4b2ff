"""`builtin:locate`: where is the red square? A visual task that only a program can answer.

Each row is one 224x224 RGB picture: a background, 40 clutter rectangles, and five small 6x6
squares, one in each target colour (`COLOURS`: red, green, blue, yellow, purple), each in a random
quadrant. The question names one colour and asks for its square's quadrant: `top left`, `top
right`, `bottom left` or `bottom right` (four answers, chance 25%).

Why the tool: the vision-language model sees the picture at 112x112 (the demo's pixel budget), where
a square is 3x3 pixels among hundreds of clutter pixels of similar hues; the tiny vision tower does
not find it (supervised on the right answers without a tool it stays near chance:
`tests/e2e/test_locate_task.py`). A program finds it exactly: the
target colours are Pillow's named colours, each with a channel of 0, while every channel of the
clutter and the background lies in 60-200, so a target colour's pixels are exactly its square's.
The program the model has to write is one line,

    from PIL import ImageColor as C;i=image_1.get_flattened_data().index(C.getrgb('red'));print('top'if i<25088 else'bottom','left'if i%224<112 else'right')

(`PROGRAM`), fast in the sandbox (Pillow 12.1 or later, no NumPy import), and what the model
must learn is the part a tiny model can: to name the question's colour in the program, and to copy
the printed phrase into `<answer></answer>`. Naming the colour is one skill for all five colours;
an earlier version wrote RGB triples, which the model had to learn colour by colour (and garbled,
mixing two triples): 30 GRPO steps left one or two colours wrong in every seed.

`builtin:locate_tool_sft`, the demo's warm start, is a weak teacher's trajectories: the program
looking for the asked colour in about 40% of the pictures (`TEACHER_RIGHT`) and for a decoy
colour otherwise (`DECOYS`, one cycle through the five, the lesson of the code demo: decoys that
swap leave the warm start unable to tell the two colours apart), the program's true output as the
observation, and that output as the answer. So the warm start calls the tool and copies what it
prints every time, and is right only when it picked the right colour or the decoy square shares
the quadrant; sampling still names the asked colour often enough for GRPO to find it.

A row is a function of (split, index) alone: its random generator is seeded with
`"locate:<split>:<index>"`, so rows are the same in every process and on every machine; train
and test pictures come from different seeds. `extra["quadrants"]` maps every colour to its
square's quadrant, `extra["colour"]` is the asked one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

SIZE = 224
ROWS = {"train": 1000, "test": 240}
COLOURS = {
    "red": (255, 0, 0),
    "green": (0, 128, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "purple": (128, 0, 128),
}
"""The target colours, as Pillow names them (`ImageColor.getrgb`); each has a channel of 0, outside
60-200, the range of everything else."""
DECOYS = {"red": "green", "green": "blue", "blue": "yellow", "yellow": "purple", "purple": "red"}
"""The colour the weak teacher mistakes each one for: one cycle through all five."""
TEACHER_RIGHT = 0.4
"""How often the weak teacher's program looks for the asked colour; otherwise for its decoy."""
SQUARE = 6
QUADRANTS = ("top left", "top right", "bottom left", "bottom right")
QUESTION = (
    "<image>Where is the {colour} square? "
    "Answer top left, top right, bottom left or bottom right inside <answer></answer>."
)
PROGRAM = (
    "from PIL import ImageColor as C;i=image_1.get_flattened_data().index(C.getrgb({colour!r}));"
    "print('top'if i<{half_rows} else'bottom','left'if i%{size}<{half} else'right')"
)


@dataclass(frozen=True)
class Scene:
    """Everything a picture shows."""

    background: tuple[int, int, int]
    clutter: tuple[tuple[tuple[int, int, int, int], tuple[int, int, int]], ...]
    """Rectangles `((x0, y0, x1, y1), colour)`, drawn first."""
    squares: dict[str, tuple[int, int]]
    """Top-left corner of each colour's square."""
    colour: str
    """The colour the question asks about."""

    def quadrant(self, colour: str) -> str:
        x, y = self.squares[colour]
        return f"{'top' if y < SIZE // 2 else 'bottom'} {'left' if x < SIZE // 2 else 'right'}"


def sample_scene(split: str, index: int) -> Scene:
    """Row `index` of `split`, as a scene (deterministic)."""
    rng = random.Random(f"locate:{split}:{index}")
    background = tuple(rng.randrange(120, 201) for _ in range(3))
    clutter = []
    for _ in range(40):
        x, y = rng.randrange(SIZE), rng.randrange(SIZE)
        box = (x, y, x + rng.randrange(4, 30), y + rng.randrange(4, 30))
        clutter.append((box, tuple(rng.randrange(60, 201) for _ in range(3))))
    squares: dict[str, tuple[int, int]] = {}
    half = SIZE // 2
    for name in COLOURS:
        qx, qy = rng.randrange(2), rng.randrange(2)
        while True:  # inside the quadrant, off its edges, apart from the other squares
            x = qx * half + rng.randrange(8, half - 8 - SQUARE)
            y = qy * half + rng.randrange(8, half - 8 - SQUARE)
            if all(abs(x - ox) > SQUARE or abs(y - oy) > SQUARE for ox, oy in squares.values()):
                break
        squares[name] = (x, y)
    return Scene(background, tuple(clutter), squares, rng.choice(sorted(COLOURS)))


def draw(scene: Scene) -> Image.Image:
    """The scene as a SIZE x SIZE RGB picture: clutter first, the five squares on top."""
    image = Image.new("RGB", (SIZE, SIZE), scene.background)
    pen = ImageDraw.Draw(image)
    for box, colour in scene.clutter:
        pen.rectangle(box, fill=colour)
    for name, (x, y) in scene.squares.items():
        pen.rectangle((x, y, x + SQUARE - 1, y + SQUARE - 1), fill=COLOURS[name])
    return image


def program(colour: str) -> str:
    """The one-line program that prints the quadrant of `colour`'s square in `image_1`."""
    return PROGRAM.format(colour=colour, half_rows=SIZE * SIZE // 2, size=SIZE, half=SIZE // 2)


def row(split: str, index: int) -> dict:
    """Row `index` of `split` in rlstack's canonical form."""
    scene = sample_scene(split, index)
    return {
        "problem": QUESTION.format(colour=scene.colour),
        "answer": scene.quadrant(scene.colour),
        "data_source": "locate",
        "images": [draw(scene)],
        "extra": {"colour": scene.colour, "quadrants": {c: scene.quadrant(c) for c in COLOURS}},
    }


def rows(split: str) -> list[dict]:
    """All rows of `split` (`train`: 1,000, `test`: 240)."""
    return [row(split, i) for i in range(ROWS[split])]


def teacher_colour(split: str, index: int, colour: str) -> str:
    """The weak teacher's colour for row `index` of `split`: the asked one with probability
    `TEACHER_RIGHT`, else its decoy, drawn once per row."""
    right = random.Random(f"locate-teacher:{split}:{index}").random() < TEACHER_RIGHT
    return colour if right else DECOYS[colour]


def tool_call(colour: str) -> str:
    """An agent turn that runs `program(colour)` in the Python tool (`code` tool-call format)."""
    return f"<code>```python\n{program(colour)}\n```</code>"


def tool_sft_rows(split: str) -> list[dict]:
    """`builtin:locate_tool_sft@<split>`: the `locate` rows with the weak teacher's whole trajectory
    as the answer: its tool call, the program's output as the tool's observation (what the Python
    tool returns for it: the printed line), and that output as the answer."""
    out = []
    for index, r in enumerate(rows(split)):
        guess = teacher_colour(split, index, r["extra"]["colour"])
        printed = r["extra"]["quadrants"][guess]
        conversation = [
            {"role": "assistant", "content": tool_call(guess)},
            {"role": "user", "content": printed},
            {"role": "assistant", "content": f"<answer>{printed}</answer>"},
        ]
        out.append({**r, "answer": conversation, "data_source": "locate_tool_sft"})
    return out


def answer_sft_rows(split: str) -> list[dict]:
    """`builtin:locate_answer_sft@<split>`: the `locate` rows with the right answer and no tool call,
    `<answer>top left</answer>`: supervision for a model that has to answer from its own view of the
    picture (the baseline of the visual demo's test that the tool is what is learned)."""
    return [
        {**r, "answer": [{"role": "assistant", "content": f"<answer>{r['answer']}</answer>"}]}
        for r in rows(split)
    ]
