"""vLLM: replica and router processes (``nodes``), the engine adapter
(``adapter``), the tiny local model (``model``) and the middleware loaded
inside each replica (``node_header``)."""
