"""An OpenManus-style agent with a custom tool, as OpenManus code writes one.

Only the import lines differ from OpenManus (``app.agent``/``app.tool`` → ``metaroles``): the
agent's configuration is class-level, the tool declares its schema as fields, and
``MathAgent()`` constructs with no arguments. tests/test_porting_metagpt.py runs it.
"""

from pydantic import Field

from metaroles import BaseTool, PythonExecute, Terminate, ToolCallAgent, ToolCollection, ToolResult

SYSTEM_PROMPT = "You are MathAgent, a careful calculator. Use the tools to compute; never guess."
NEXT_STEP_PROMPT = "Call a tool for the next step, or terminate when the answer is known."


class AddNumbers(BaseTool):
    name: str = "add_numbers"
    description: str = "Adds two numbers and returns the sum."
    parameters: dict = {
        "type": "object",
        "properties": {
            "a": {"type": "number", "description": "The first number."},
            "b": {"type": "number", "description": "The second number."},
        },
        "required": ["a", "b"],
    }

    async def execute(self, a: float, b: float) -> ToolResult:
        return ToolResult(output=f"{a + b:g}")


class MathAgent(ToolCallAgent):
    name: str = "MathAgent"
    description: str = "An agent that does arithmetic with tools."

    system_prompt: str = SYSTEM_PROMPT
    next_step_prompt: str = NEXT_STEP_PROMPT

    max_steps: int = 5
    max_observe: int = 2000

    available_tools: ToolCollection = Field(
        default_factory=lambda: ToolCollection(AddNumbers(), PythonExecute(), Terminate())
    )
