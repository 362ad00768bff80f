# The agent's connection manager, linked as sroce(8) links it.
target_link_libraries(${name} PRIVATE sroce_agent)
