"""Tools the agent loop can call: the interface, the config file loader, and the tools that ship."""
from .base import BaseTool, ToolSchema, load_tools
from .calculator import CalculatorTool
from .python_sandbox import PythonSandboxTool

__all__ = ["BaseTool", "ToolSchema", "load_tools", "CalculatorTool", "PythonSandboxTool"]
