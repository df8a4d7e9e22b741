"""The strategy editor: the widget, its model, its view and the stage controls."""
