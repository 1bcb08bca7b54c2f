"""Pydantic types -> structures on the real Gemma vocabulary: dumped instances are accepted token by token, invalid
texts are refused, random walks under the mask parse back into the type, and errors are typed."""

from __future__ import annotations

import datetime
import enum
import ipaddress
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Literal, NotRequired, Optional, Union

import numpy as np
import pytest
from pydantic import (
    UUID4,
    AnyUrl,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    FilePath,
    HttpUrl,
    IPvAnyAddress,
    Json,
    NaiveDatetime,
    Tag,
    TypeAdapter,
    UrlConstraints,
    ValidationError,
    conint,
    conlist,
    constr,
)
from typing_extensions import TypedDict

import constrain
from constrain.compilers.pydantic import compile_pydantic, parse, pydantic_schema
from constrain.errors import JsonSchemaError, PydanticSchemaError, StructureError

# -- the types -------------------------------------------------------------------------------------------------


class Color(str, enum.Enum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 3


class Person(BaseModel):
    name: str = Field(min_length=1, max_length=20)
    age: int = Field(ge=0, le=150)
    email: Optional[str] = None


class Constrained(BaseModel):
    score: float = Field(gt=0, lt=1)
    count: conint(ge=-5, le=500, multiple_of=5)
    ratio: Annotated[float, Field(ge=0, le=100, multiple_of=0.5)]
    code: constr(pattern=r"^[A-Z]{3}-[0-9]{3}$")
    slug: Annotated[str, Field(min_length=2, max_length=8, pattern=r"^[a-z-]+$")]
    tags: conlist(str, min_length=1, max_length=3)


class Choices(BaseModel):
    color: Color
    level: Level
    mode: Literal["fast", "slow"]
    flag: Literal[True, None, 7]


class Cat(BaseModel):
    pet_type: Literal["cat"]
    lives: int = Field(ge=1, le=9)


class Dog(BaseModel):
    pet_type: Literal["dog"]
    good: bool


class Lizard(BaseModel):
    pet_type: Literal["lizard", "gecko"]
    length: float


class Owner(BaseModel):
    pet: Union[Cat, Dog, Lizard] = Field(discriminator="pet_type")
    others: list[Annotated[Union[Cat, Dog], Field(discriminator="pet_type")]] = []


class Circle(BaseModel):
    kind: Literal["circle"] = "circle"
    r: float


class Square(BaseModel):
    kind: Literal["square"] = "square"
    side: float


class Drawing(BaseModel):
    """Tags with defaults: pydantic still reads the tag, so the structure requires it."""

    main: Union[Circle, Square] = Field(discriminator="kind")
    extra: Optional[Annotated[Union[Circle, Square], Field(discriminator="kind")]] = None


class Tree(BaseModel):
    value: int
    children: list[Tree] = []


class Employee(BaseModel):
    name: str
    team: Optional[Team] = None


class Team(BaseModel):
    title: str
    lead: Optional[Employee] = None
    members: list[Employee] = []


Employee.model_rebuild()


class Address(TypedDict):
    street: str
    zip: Annotated[str, Field(pattern=r"^[0-9]{5}$")]
    unit: NotRequired[int]


@dataclass
class Point:
    x: int
    y: int
    label: str = "origin"


class Containers(BaseModel):
    pair: tuple[int, str]
    many: tuple[float, ...]
    scores: dict[str, int]
    by_id: dict[int, bool]
    colors: set[Color]
    points: list[Point]
    address: Address


class Temporal(BaseModel):
    when: datetime.datetime
    day: datetime.date
    at: datetime.time
    took: datetime.timedelta
    id: uuid.UUID
    site: HttpUrl


class Aliased(BaseModel):
    model_config = ConfigDict(extra="forbid")
    first_name: str = Field(alias="firstName")
    retries: int = Field(default=3, ge=0, le=9)


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: int


class Nested(BaseModel):
    owner: Person
    people: list[Person] = Field(max_length=2)
    best: Optional[Person] = None
    matrix: list[list[Annotated[int, Field(ge=0, le=9)]]]


Scalars = Union[Person, Point, int, None]


def _dump(model_type: Any, value: Any) -> str:
    return TypeAdapter(model_type).dump_json(value, by_alias=True).decode()


def _edit(model_type: Any, value: Any, **changes: Any) -> str:
    """``value``'s dump with top-level keys replaced (a value of ``...`` drops the key)."""
    data = json.loads(_dump(model_type, value))
    for key, new in changes.items():
        if new is ...:
            del data[key]
        else:
            data[key] = new
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _cases() -> dict[str, tuple[Any, list[Any], list[str]]]:
    """name -> (type, valid instances, texts pydantic refuses)."""
    ada = Person(name="Ada Lovelace", age=36, email="ada@example.org")
    con = Constrained(score=0.25, count=45, ratio=12.5, code="ABC-123", slug="a-b", tags=["x", "é"])
    choices = Choices(color=Color.GREEN, level=Level.HIGH, mode="slow", flag=None)
    owner = Owner(pet=Dog(pet_type="dog", good=True), others=[Cat(pet_type="cat", lives=3)])
    drawing = Drawing(main=Circle(r=1.5), extra=Square(side=2))
    tree = Tree(value=1, children=[Tree(value=2), Tree(value=-3, children=[Tree(value=4)])])
    team = Team(title="core", lead=Employee(name="Lin"), members=[Employee(name="Bo", team=Team(title="x"))])
    address: Address = {"street": "1 Main St", "zip": "02139", "unit": 4}
    containers = Containers(
        pair=(1, "a"),
        many=(1.5, -2.0),
        scores={"a": 1, "b": 2},
        by_id={7: True, -1: False},
        colors={Color.RED},
        points=[Point(1, 2)],
        address={"street": "x", "zip": "12345"},
    )
    temporal = Temporal(
        when=datetime.datetime(2024, 2, 29, 13, 45, 30, 123000, tzinfo=datetime.UTC),
        day=datetime.date(1999, 12, 31),
        at=datetime.time(8, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=-5))),
        took=datetime.timedelta(days=2, hours=3),
        id=uuid.UUID("123e4567-e89b-12d3-a456-426614174000"),
        site="https://example.com/a/b?q=1",
    )
    nested = Nested(owner=ada, people=[ada], best=None, matrix=[[1, 2], [], [9]])
    return {
        "Person": (
            Person,
            [ada, Person(name="é", age=0)],
            [
                _edit(Person, ada, name=""),
                _edit(Person, ada, age=151),
                _edit(Person, ada, age=-1),
                _edit(Person, ada, name=...),
                _edit(Person, ada, name="x" * 21),
            ],
        ),
        "Constrained": (
            Constrained,
            [con],
            [
                _edit(Constrained, con, score=1),
                _edit(Constrained, con, count=44),
                _edit(Constrained, con, ratio=12.25),
                _edit(Constrained, con, code="AB-123"),
                _edit(Constrained, con, slug="A"),
                _edit(Constrained, con, tags=[]),
                _edit(Constrained, con, tags=["a", "b", "c", "d"]),
            ],
        ),
        "Choices": (
            Choices,
            [choices, Choices(color=Color.RED, level=Level.LOW, mode="fast", flag=7)],
            [
                _edit(Choices, choices, color="purple"),
                _edit(Choices, choices, level=2),
                _edit(Choices, choices, flag=False),
            ],
        ),
        "Owner": (
            Owner,
            [owner, Owner(pet=Lizard(pet_type="gecko", length=0.5))],
            [
                _edit(Owner, owner, pet={"pet_type": "dog", "lives": 3}),
                _edit(Owner, owner, pet={"pet_type": "cow"}),
                _edit(Owner, owner, others=[{"pet_type": "lizard", "length": 1}]),
            ],
        ),
        "Drawing": (Drawing, [drawing], [_edit(Drawing, drawing, main={"r": 1.5})]),
        "Tree": (Tree, [tree, Tree(value=0)], ['{"value":1,"children":[{"children":[]}]}', '{"value":1.5}']),
        "Team": (Team, [team], ['{"title":"a","lead":{"name":"b","team":{"lead":null}}}']),
        "Address": (Address, [address], ['{"street":"a","zip":"1234"}', '{"zip":"12345"}']),
        "Point": (Point, [Point(3, -4, "p")], ['{"x":1}', '{"x":1,"y":"a"}']),
        "Containers": (
            Containers,
            [containers],
            [
                _edit(Containers, containers, pair=[1, "a", 2]),
                _edit(Containers, containers, by_id={"x": True}),
                _edit(Containers, containers, colors=["pink"]),
                _edit(Containers, containers, scores={"a": "x"}),
            ],
        ),
        "Temporal": (
            Temporal,
            [temporal],
            [
                _edit(Temporal, temporal, day="2023-02-29"),
                _edit(Temporal, temporal, day="0000-01-01"),
                _edit(Temporal, temporal, when="2024-01-01T25:00:00Z"),
                _edit(Temporal, temporal, took="P99999999999D"),
                _edit(Temporal, temporal, id="123e4567"),
                _edit(Temporal, temporal, site="ftp://example.com/"),
                _edit(Temporal, temporal, site="https://example.com:99999/"),
            ],
        ),
        "Aliased": (
            Aliased,
            [Aliased(firstName="Grace"), Aliased(firstName="G", retries=0)],
            ['{"first_name":"Grace"}', '{"firstName":"G","retries":10}'],
        ),
        "Open": (Open, [Open(id=1, color="red", n=[1, {"a": None}])], ['{"color":"red"}']),
        "Nested": (
            Nested,
            [nested],
            [
                _edit(Nested, nested, people=[{}]),
                _edit(Nested, nested, matrix=[[10]]),
                _edit(Nested, nested, owner=None),
            ],
        ),
        "Scalars": (Scalars, [ada, Point(1, 2), 5, None], ['"a"', "1.5", "[]"]),
    }


CASES = _cases()


@pytest.fixture(scope="module")
def structures(gemma_vocab):
    """Compiled once per type for every test of this module."""
    cache: dict[str, Any] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = compile_pydantic(CASES[name][0], gemma_vocab)
        return cache[name]

    return get


def accepted(structure, tokenizer, text: str, check_mask: bool = False) -> bool:
    """Whether ``text``, tokenised as the model would write it, is accepted token by token and can end."""
    matcher = structure.matcher()
    for token in tokenizer.encode(text, add_special_tokens=False):
        if check_mask:
            mask = matcher.mask()
            assert (mask[token >> 5] >> (token & 31)) & 1, (text, token)
        if not matcher.accepts(token):
            return False
        matcher.advance(token)
    return matcher.is_accepting()


# -- dumped instances and invalid texts ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_dumped_instances_are_accepted_and_invalid_texts_refused(name, structures, gemma_tokenizer):
    model_type, good, bad = CASES[name]
    structure = structures(name)
    assert structure.relaxations == []
    for value in good:
        text = _dump(model_type, value)
        assert accepted(structure, gemma_tokenizer, text, check_mask=True), text
        assert parse(model_type, text) == value
    for text in bad:
        assert not accepted(structure, gemma_tokenizer, text), text
        with pytest.raises(ValidationError):
            parse(model_type, text)


def test_extra_keys_are_closed_by_default_and_open_on_request(gemma_vocab, gemma_tokenizer, structures):
    text = '{"name":"a","age":1,"nickname":"b"}'
    assert parse(Person, text).name == "a"  # pydantic ignores it: only noise
    assert not accepted(structures("Person"), gemma_tokenizer, text)
    assert pydantic_schema(Person)["additionalProperties"] is False
    assert "additionalProperties" not in pydantic_schema(Person, additional_properties_default=True)
    opened = compile_pydantic(Person, gemma_vocab, additional_properties_default=True)
    assert accepted(opened, gemma_tokenizer, text)
    assert pydantic_schema(Open)["additionalProperties"] is True


class Keywords(BaseModel):
    default: UUID4
    enum: Annotated[str, Field(pattern="^a")]


def test_validation_schema_aliases_defaults_and_required_tags():
    schema = pydantic_schema(Aliased)
    assert list(schema["properties"]) == ["firstName", "retries"] and schema["required"] == ["firstName"]
    union = pydantic_schema(Drawing)["properties"]["main"]
    assert union["required"] == ["kind"] and "oneOf" in union
    fields = pydantic_schema(Keywords)["properties"]  # field names that are keywords are still schemas
    assert fields["default"]["format"] == "uuid" and "pattern" in fields["default"]


def test_decimals_are_numbers_within_the_digit_limits(gemma_vocab, gemma_tokenizer):
    Money = Annotated[Decimal, Field(max_digits=6, decimal_places=2, ge=0)]
    structure = compile_pydantic(Money, gemma_vocab)
    for text in ["0", "1234.5", "9999.99", "0.01", "12.50"]:
        assert accepted(structure, gemma_tokenizer, text), text
        assert parse(Money, text) == Decimal(text)
    for text in ["10000", "1.234", "-1", '"12.5"', "1e3"]:
        assert not accepted(structure, gemma_tokenizer, text), text
    loose = compile_pydantic(Decimal, gemma_vocab)
    assert accepted(loose, gemma_tokenizer, "-123456789.012345")
    assert not accepted(loose, gemma_tokenizer, "1234567890.1234567")  # 17 digits would go through a float


def test_pydantic_types_with_formats_are_tightened(gemma_vocab, gemma_tokenizer):
    cases = {
        UUID4: (['"123e4567-e89b-42d3-a456-426614174000"'], ['"123e4567-e89b-12d3-a456-426614174000"']),
        IPvAnyAddress: (['"10.0.0.1"', '"::1"'], ['"10.0.0.256"', '"x"']),
        AnyUrl: (['"https://a.example/x?y#z"', '"git+ssh://host"'], ['"mailto:a@b"', '"http://1.2.3.4.5/"']),
        dict[int, str]: (['{"-3":"a","0":"b"}'], ['{"03":"a"}', '{"a":"b"}']),
        Annotated[bytes, Field(max_length=2)]: (['"ab"'], ['"é"', '"abc"']),
        Annotated[float, Field(allow_inf_nan=False)]: (["1.5", "-2"], ["1e999"]),
        # narrower than pydantic: durations of at most 6 digits per number, date-times with an offset
        datetime.timedelta: (['"P999999DT1H"'], ['"P9999999D"', '"PT1.5S"']),
        datetime.datetime: (['"2024-01-01T10:00:00.5+01:00"'], ['"2024-01-01T10:00:00"', '"0000-01-01T00:00:00Z"']),
    }
    for model_type, (good, bad) in cases.items():
        structure = compile_pydantic(model_type, gemma_vocab)
        for text in good:
            assert accepted(structure, gemma_tokenizer, text), (model_type, text)
            parse(model_type, text)
        for text in bad:
            assert not accepted(structure, gemma_tokenizer, text), (model_type, text)


# -- random walks under the mask -------------------------------------------------------------------------------


class Walker:
    """Random texts under a structure's mask: short tokens preferred, closing tokens more and more often, so
    walks end."""

    def __init__(self, vocab):
        self.vocab = vocab
        lengths = np.diff(np.asarray(vocab.offsets)).astype(float)
        self.weight = 1.0 / (1.0 + lengths) ** 3
        self.is_eos = np.zeros(vocab.size, dtype=bool)
        self.is_eos[list(vocab.eos_ids)] = True
        self.closes = np.array([bool(b) and set(b) <= set(b'"]}') for b in map(vocab.token_bytes, range(vocab.size))])

    def walk(self, structure, rng: np.random.Generator, max_steps: int = 400) -> str:
        matcher = structure.matcher()
        tokens: list[int] = []
        for step in range(max_steps):
            allowed = matcher.allowed_tokens()
            allowed = allowed[~self.is_eos[allowed]]
            if matcher.is_accepting() and (len(allowed) == 0 or step > 40 or rng.random() < 0.3):
                return self.vocab.decode(tokens).decode()
            assert len(allowed), f"dead end after {self.vocab.decode(tokens)!r}"
            if rng.random() < min(0.9, step / 40):
                closing = allowed[self.closes[allowed]]
                allowed = closing if len(closing) else allowed
            cumulative = np.cumsum(self.weight[allowed])
            token = int(allowed[np.searchsorted(cumulative, rng.random() * cumulative[-1])])
            matcher.advance(token)
            tokens.append(token)
        raise AssertionError(f"no end after {max_steps} tokens: {self.vocab.decode(tokens)!r}")


@pytest.fixture(scope="module")
def walker(gemma_vocab) -> Walker:
    return Walker(gemma_vocab)


WALKS = 20


@pytest.mark.parametrize("name", list(CASES))
def test_random_walks_parse_back(name, structures, walker):
    model_type = CASES[name][0]
    structure = structures(name)
    rng = np.random.default_rng(sum(map(ord, name)))
    texts = [walker.walk(structure, rng) for _ in range(WALKS)]
    for text in texts:
        try:
            parse(model_type, text)
        except ValidationError as exc:
            pytest.fail(f"{text!r} does not parse: {exc}")
    assert len(set(texts)) > WALKS // 4, texts


# -- errors and relaxations ------------------------------------------------------------------------------------


class Opaque:
    pass


class WithCallable(BaseModel):
    f: Callable[[int], int]


def _kind(value: Any) -> str:
    return value.get("kind") if isinstance(value, dict) else value.kind


Shape = Annotated[Union[Annotated[Circle, Tag("circle")], Annotated[Square, Tag("square")]], Discriminator(_kind)]


class Canvas(BaseModel):
    shapes: list[Shape]


@pytest.mark.parametrize(
    "model_type, match",
    [
        (Opaque, "Opaque: pydantic cannot write a JSON Schema"),
        (WithCallable, "WithCallable: pydantic cannot write a JSON Schema"),
        ("Undefined", "pydantic cannot write a JSON Schema"),
        (NaiveDatetime, "time-zone constraint 'naive'"),
        (dict[float, int], "dict keys"),
        (Json[int], r"Json\[...\]"),
        (Canvas, "callable Discriminator"),
        (FilePath, "format 'file-path'"),
        (Annotated[datetime.date, Field(gt=datetime.date(2000, 1, 1))], r"date bounds \(gt\)"),
    ],
)
def test_types_pydantic_cannot_describe_exactly_are_refused(model_type, match, gemma_vocab):
    with pytest.raises(PydanticSchemaError, match=match) as info:
        compile_pydantic(model_type, gemma_vocab)
    assert isinstance(info.value, StructureError) and info.value.type is model_type


def test_lenient_mode_lists_what_it_ignores(gemma_vocab, walker):
    structure = compile_pydantic(Canvas, gemma_vocab, strict=False)
    assert any("Discriminator" in note for note in structure.relaxations)
    tags = compile_pydantic(set[str], gemma_vocab, strict=False)
    assert any("uniqueItems" in note for note in tags.relaxations)
    rng = np.random.default_rng(1)
    for _ in range(5):  # repeats may appear; pydantic collapses them
        assert isinstance(parse(set[str], walker.walk(tags, rng)), set)


def test_json_compiler_refusals_propagate_with_the_pointer(gemma_vocab):
    with pytest.raises(JsonSchemaError) as info:
        compile_pydantic(set[str], gemma_vocab)
    assert info.value.pointer == "/uniqueItems"
    with pytest.raises(JsonSchemaError) as info:  # words counted beside characters: too many length states
        compile_pydantic(constr(pattern=r"^(?:\S+\s+){0,49}\S+$", max_length=500), gemma_vocab)
    assert info.value.pointer == "/maxLength"


def test_url_with_a_length_bound_is_exact(gemma_vocab, gemma_tokenizer):
    structure = compile_pydantic(Annotated[AnyUrl, UrlConstraints(max_length=40)], gemma_vocab)
    assert accepted(structure, gemma_tokenizer, json.dumps("https://example.com/a"))
    assert accepted(structure, gemma_tokenizer, json.dumps("https://example.com/" + "a" * 20))  # 40 characters
    assert not accepted(structure, gemma_tokenizer, json.dumps("https://example.com/" + "a" * 21))
    assert not accepted(structure, gemma_tokenizer, json.dumps("not a url"))


def test_sets_of_few_enum_values_are_exact(gemma_vocab, gemma_tokenizer):
    structure = compile_pydantic(set[Color], gemma_vocab)
    assert accepted(structure, gemma_tokenizer, '["blue","red"]')
    assert not accepted(structure, gemma_tokenizer, '["red","red"]')


def test_public_api_exports_compile_pydantic():
    assert constrain.compile_pydantic is compile_pydantic
    assert parse(Point, '{"x":1,"y":2}') == Point(1, 2)
    assert pydantic_schema(ipaddress.IPv4Address) == {"format": "ipv4", "type": "string"}
