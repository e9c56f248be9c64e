"""The agent loop: multi-turn rollouts with tool calls and user-side interactions (verl's multi_turn keys).

loop.py runs one sample's turns; rollout.py runs a batch and gives the single-turn output layout (tool and
user tokens carry response_mask 0, so algos/ needs to know nothing about turns); tools/ holds the tool
interface and the shipped tools; interaction.py the user-side interface; chat.py the per-turn templating;
parser.py the tool-call formats.
"""
from .interaction import BaseInteraction, load_interactions
from .loop import AgentLoop, LoopSettings, SampleInputs, Trajectory
from .parser import TOOL_CALL_FORMATS, ToolCall
from .rollout import AgentRollout, agent_metrics
from .tools import BaseTool, ToolSchema, load_tools

__all__ = ["AgentLoop", "AgentRollout", "BaseInteraction", "BaseTool", "LoopSettings", "SampleInputs",
           "TOOL_CALL_FORMATS", "ToolCall", "ToolSchema", "Trajectory", "agent_metrics", "load_interactions",
           "load_tools"]
