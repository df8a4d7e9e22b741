import './base.css';
import './cellmode.css';
import './panel.css';
